"""A hung store never stalls the engine (issue #14, item 5): the demo's workload on two engine
nodes sharing a Redis store, with the server paused by SIGSTOP for a while mid-run. No request's
match waits longer than the lookup budget plus a margin, the breaker opens while it is paused
and closes again after SIGCONT, and every output equals the cache-off run.

``RADIXLINK_PAUSE_S`` sets the pause (default 3 s here; the issue's check uses 30 s).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from typing import Any

import numpy as np
import pytest
import torch
from redis_server import RedisServer

from radixlink.cache import UnifiedCache
from radixlink.contract import ComponentType
from radixlink.engine.engine import Engine, cache_config
from radixlink.engine.weights import TINY_HYBRID, ByteTokenizer, random_model
from radixlink.engine.workload import WorkloadSpec, build_workload, schedule, turn_prompt
from radixlink.linker.breaker import BreakerConfig
from radixlink.linker.core import ExternalCacheLinker
from radixlink.nocache import NoPrefixCache

TINY_FULL = dataclasses.replace(TINY_HYBRID, name="tiny-full",
                                layer_types=(ComponentType.FULL,) * 3)
TOK = ByteTokenizer()
WORKLOAD = WorkloadSpec(num_conversations=4, num_turns=4, context_tokens=160, excerpt_chars=60)
BUDGET_S, MARGIN_S, MAX_COOLDOWN_S = 0.25, 0.25, 2.0
PAUSE_S = float(os.environ.get("RADIXLINK_PAUSE_S", "3"))

pytestmark = pytest.mark.redis


class TimedCache(UnifiedCache):
    """The real cache, recording how long each ``match_prefix`` (device + LOOKUP) took."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.match_seconds: list[float] = []

    def match_prefix(self, tokens: Any, req_id: Any = None, *, namespace: Any = None,
                     touch: bool = True) -> Any:
        if not touch:  # the linker's own peeks (formerly ``peek_prefix``) are not timed
            return super().match_prefix(tokens, req_id, namespace=namespace, touch=False)
        start = time.perf_counter()
        try:
            return super().match_prefix(tokens, req_id, namespace=namespace)
        finally:
            self.match_seconds.append(time.perf_counter() - start)


def _engines(model: Any, url: str | None, num: int) -> list[Engine]:
    out = []
    for _ in range(num):
        config = cache_config(model.spec, num_tokens=4096, page_size=16, linker=url is not None)
        if url is None:
            out.append(Engine(model, TOK, NoPrefixCache(config)))
            continue
        cache = TimedCache(config)
        linker = ExternalCacheLinker(cache, url, load_timeout_s=2.0,
                                     breaker=BreakerConfig(budget_s=BUDGET_S,
                                                           max_cooldown_s=MAX_COOLDOWN_S))
        out.append(Engine(model, TOK, cache, linker))
    return out


def _turns(engines: list[Engine], turns: list[list[tuple[int, int, int]]], convs: Any,
           history: dict[int, list[int]], out: dict[Any, list[int]]) -> None:
    for step in turns:
        for node, c, k in step:
            prompt = turn_prompt(TOK, convs[c], k, history.get(c, []))
            res = engines[node].generate(prompt, 5, req_id=f"{c}:{k}")
            history[c] = prompt + res.output_ids
            out[(c, k)] = res.output_ids


def _prompts(turns: list[list[tuple[int, int, int]]], convs: Any,
             outputs: dict[Any, list[int]]) -> dict[Any, list[int]]:
    """The prompt each (conversation, turn) of ``turns`` was given."""
    out, history = {}, {}
    for step in turns:
        for _, c, k in step:
            out[(c, k)] = turn_prompt(TOK, convs[c], k, history.get(c, []))
            history[c] = out[(c, k)] + outputs[(c, k)]
    return out


def test_a_paused_redis_never_stalls_the_engine(server: RedisServer) -> None:
    """Flow: turn 0 with Redis up (pages offloaded); SIGSTOP; turns 1-2 (every match within
    budget + margin, the breaker opens, requests served from device or recomputed); SIGCONT;
    turn 3 (the breaker closes after its probe and store hits come back). Outputs equal the
    cache-off run's."""
    torch.set_num_threads(1)
    model = random_model(TINY_FULL, seed=0)
    convs = build_workload(WORKLOAD, TOK)
    turns = schedule(WORKLOAD.num_conversations, WORKLOAD.num_turns, 2)
    expected: dict[Any, list[int]] = {}
    _turns(_engines(model, None, 2), turns, convs, {}, expected)

    engines = _engines(model, server.url, 2)
    got: dict[Any, list[int]] = {}
    history: dict[int, list[int]] = {}
    _turns(engines, turns[:1], convs, history, got)
    assert all(e.flush(timeout=10) for e in engines)
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    paused_at = time.monotonic()
    _turns(engines, turns[1:3], convs, history, got)
    prompts = {key: prompt for key, prompt in _prompts(turns[:3], convs, got).items()}
    replayed = 0
    while time.monotonic() - paused_at < PAUSE_S:  # keep serving for the whole pause
        key = sorted(prompts)[replayed % len(prompts)]
        res = engines[replayed % 2].generate(prompts[key], 5, req_id=f"again:{replayed}")
        assert res.output_ids == expected[key]
        replayed += 1
    during = [s for e in engines for s in e.cache.match_seconds]
    opened = [e.linker.stats()["store_breaker_opens"] for e in engines]
    os.kill(server.proc.pid, signal.SIGCONT)
    time.sleep(MAX_COOLDOWN_S * 1.2 + 0.1)  # past the breakers' longest (jittered) cool-down
    _turns(engines, turns[3:], convs, history, got)
    states = [e.linker.stats()["store_breaker_state"] for e in engines]
    for engine in engines:
        engine.linker.close()
        engine.cache.check_invariants()
        assert engine.cache.stats()["held_tokens"] == 0
    p99 = float(np.percentile(during, 99))
    print(f"paused {PAUSE_S:.0f} s: {len(during)} matches, p99 {p99 * 1e3:.1f} ms, "
          f"max {max(during) * 1e3:.1f} ms; breaker opens {opened}, after SIGCONT {states}")
    assert max(during) <= BUDGET_S + MARGIN_S, sorted(during)[-5:]
    assert sum(opened) >= 1
    assert states == ["closed", "closed"]
    assert got == expected
