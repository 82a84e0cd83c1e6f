"""Engine nodes as separate processes: each loads the model, builds its own cache (and linker
on the shared store) and serves the turns the coordinator routes to it, round by round.

Owns process start/stop, the message protocol and turn bookkeeping. Must not decide caching
policy (the engine and the cache do) nor print reports (demo.py and the e2e bench do).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from radixlink.engine.engine import RequestResult
from radixlink.engine.model import ModelSpec
from radixlink.engine.workload import WorkloadSpec, schedule

MODES = ("off", "device", "store")  # cache off, device cache only, device cache + shared store


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSettings:
    """What every node builds.

    Attributes:
        model: a ``load_model`` name, or a ``ModelSpec`` for seeded random weights with the
            byte tokenizer (tests).
        workload: the workload spec (each node builds the same conversations).
        store_urls: one store URL per node for mode "store" (all naming the shared store).
        num_tokens: device pool slots per node.
        page_size: tokens per page.
        num_threads: torch threads per node.
        kv_events: caches emit KV events, returned with each turn (for a router).
    """

    model: str | ModelSpec
    workload: WorkloadSpec
    store_urls: tuple[str, ...] = ()
    num_tokens: int = 16384
    page_size: int = 16
    num_threads: int = 1
    kv_events: bool = False


@dataclass(slots=True, kw_only=True)
class TurnRecord:
    """One served turn: where it ran, its prompt and the engine's record; with
    ``NodeSettings.kv_events``, the cache's KV events since the previous turn, and the time the
    turn waited on its node behind earlier turns of the same batch."""

    node: int
    conv_id: int
    turn: int
    prompt_ids: list[int]
    result: RequestResult
    reply: str = ""
    kv_events: list[Any] = field(default_factory=list)
    wait_s: float = 0.0


def _build_engine(settings: NodeSettings, node: int, mode: str, model: Any, tok: Any) -> Any:
    from radixlink.cache import UnifiedCache
    from radixlink.engine.engine import Engine, cache_config
    from radixlink.linker.core import ExternalCacheLinker
    from radixlink.nocache import NoPrefixCache

    config = cache_config(model.spec, num_tokens=settings.num_tokens,
                          page_size=settings.page_size, linker=mode == "store")
    if mode == "off":
        return Engine(model, tok, NoPrefixCache(config))
    cache = UnifiedCache(config)
    if settings.kv_events:
        from radixlink.kvevents import KVEventQueue

        cache.enable_kv_events(KVEventQueue(node_id=str(node)))
    linker = ExternalCacheLinker(cache, settings.store_urls[node]) if mode == "store" else None
    return Engine(model, tok, cache, linker)


WARM_UP_PROMPT = 32  # tokens
WARM_UP_NEW = 2


def _warm_up(settings: NodeSettings, model: Any, tok: Any) -> None:
    """One short request on a throwaway cache-off engine (first calls pay one-time setup)."""
    from dataclasses import replace

    # NOTE: the pool must hold the whole request whatever the page size (4 pages of 4 or 8
    # tokens did not: the demo failed in warm-up at --page-size 4 and 8), plus one page.
    need = WARM_UP_PROMPT + WARM_UP_NEW + settings.page_size
    pages = -(-need // settings.page_size)
    small = replace(settings, num_tokens=max(4, pages) * settings.page_size)
    _build_engine(small, 0, "off", model, tok).generate(list(range(1, WARM_UP_PROMPT + 1)),
                                                        WARM_UP_NEW)


def _drain(cache: Any) -> list[Any]:
    """The cache's KV events since the last call (none when events are off)."""
    events = getattr(cache, "kv_events", None)
    return events.drain() if events is not None else []


def _cache_facts(cache: Any) -> dict[str, Any] | None:
    """What a router needs to hash prompts as this cache does (None when events are off)."""
    if getattr(cache, "kv_events", None) is None or cache.config.kv_layout is None:
        return None
    config = cache.config
    return {"namespace": config.namespace, "page_size": config.page_size,
            "bytes_per_token": config.kv_layout.token_bytes, "hash_algo": config.hash_algo}


def _node_main(settings: NodeSettings, node: int, inbox: Any, outbox: Any) -> None:
    """A node process: ("begin", mode) / ("run", [(conv, turn, history)], max_new) /
    ("end",) -> stats / ("stop",)."""
    try:
        import time

        import torch

        from radixlink.engine.weights import (
            ByteTokenizer,
            ChatTokenizer,
            load_model,
            random_model,
        )
        from radixlink.engine.workload import build_workload, turn_prompt

        torch.set_num_threads(settings.num_threads)
        start = time.perf_counter()
        tok: ChatTokenizer
        if isinstance(settings.model, ModelSpec):
            model, tok = random_model(settings.model), ByteTokenizer()
        else:
            model, tok = load_model(settings.model)
        convs = build_workload(settings.workload, tok)
        _warm_up(settings, model, tok)
        outbox.put(("ready", node, time.perf_counter() - start))
        engine: Any = None
        while True:
            msg = inbox.get()
            if msg[0] == "begin":
                engine = _build_engine(settings, node, msg[1], model, tok)
                outbox.put(("begun", node, _cache_facts(engine.cache)))
            elif msg[0] == "run":
                received = time.perf_counter()
                for conv_id, turn, history in msg[1]:
                    prompt = turn_prompt(tok, convs[conv_id], turn, history)
                    wait = time.perf_counter() - received
                    res = engine.generate(prompt, msg[2], req_id=f"{node}:{conv_id}:{turn}")
                    outbox.put(("done", node, TurnRecord(node=node, conv_id=conv_id, turn=turn,
                                                         prompt_ids=prompt, result=res,
                                                         reply=tok.decode(res.output_ids),
                                                         kv_events=_drain(engine.cache),
                                                         wait_s=wait)))
                engine.flush()  # NOTE: the next round's other node must find these pages
                outbox.put(("ran", node, _drain(engine.cache)))
            elif msg[0] == "end":
                stats = engine.stats()
                if engine.linker is not None:
                    engine.linker.close()
                engine = None
                outbox.put(("ended", node, stats))
            else:
                return
    except BaseException:  # NOTE: report any failure to the coordinator instead of hanging it
        outbox.put(("error", node, traceback.format_exc()))


class NodePool:
    """``num_nodes`` engine processes (multiprocessing spawn) driven round by round.

    Use as a context manager; ``run`` replays the whole workload in one mode and returns
    ``{(conv_id, turn): TurnRecord}`` plus each node's final engine stats.

    Args:
        settings: what each node builds.
        num_nodes: processes to start.
    """

    def __init__(self, settings: NodeSettings, num_nodes: int):
        if num_nodes <= 0:
            raise ValueError(f"num_nodes must be positive, got {num_nodes}")
        self.settings, self.num_nodes = settings, num_nodes
        ctx = mp.get_context("spawn")
        self._outbox = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(num_nodes)]
        self._procs = [ctx.Process(target=_node_main, args=(settings, i, q, self._outbox),
                                   daemon=True) for i, q in enumerate(self._inboxes)]
        self.load_s: list[float] = [0.0] * num_nodes

    def __enter__(self) -> NodePool:
        for p in self._procs:
            p.start()
        for node, load_s in self._collect("ready", range(self.num_nodes)).items():
            self.load_s[node] = load_s
        return self

    def __exit__(self, *exc: object) -> None:
        for q in self._inboxes:
            q.put(("stop",))
        for p in self._procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()

    def _collect(self, kind: str, nodes: Any,
                 on_done: Callable[[TurnRecord], None] | None = None) -> dict[int, Any]:
        """Wait for a ``kind`` reply from each of ``nodes``; "done" records go to ``on_done``."""
        waiting, replies = set(nodes), {}
        while waiting:
            try:
                got, node, payload = self._outbox.get(timeout=5.0)
            except queue.Empty:  # check that the processes are still alive
                dead = [i for i in waiting if not self._procs[i].is_alive()]
                if dead:
                    raise RuntimeError(f"engine node(s) {dead} exited unexpectedly") from None
                continue
            if got == "error":
                raise RuntimeError(f"engine node {node} failed:\n{payload}")
            if got == "done":
                assert on_done is not None, f"unexpected turn record from node {node}"
                on_done(payload)
                continue
            assert got == kind, f"node {node} replied {got!r}, expected {kind!r}"
            waiting.discard(node)
            replies[node] = payload
        return replies

    def run(self, mode: str, max_new_tokens: int,
            on_done: Callable[[TurnRecord], None] | None = None, router: Any = None,
            ) -> tuple[dict[tuple[int, int], TurnRecord], dict[int, dict[str, Any]]]:
        """Replay the workload in ``mode`` ("off", "device" or "store"), round by round.

        ``router`` (a ``radixlink.routing.process.RouterProcess``; needs
        ``NodeSettings.kv_events``) picks each turn's node instead of the fixed schedule and is
        told every finished turn and the nodes' KV events.

        Returns:
            (records by (conv_id, turn), engine stats by node).
        """
        if mode not in MODES or (mode == "store" and len(self.settings.store_urls)
                                 < self.num_nodes):
            raise ValueError(f"mode must be one of {MODES} (store needs one URL per node), "
                             f"got {mode!r}")
        nodes = range(self.num_nodes)
        for q in self._inboxes:
            q.put(("begin", mode))
        facts = self._collect("begun", nodes)
        if router is not None:
            router.begin(facts[0])
        records: dict[tuple[int, int], TurnRecord] = {}

        def done(rec: TurnRecord) -> None:
            records[(rec.conv_id, rec.turn)] = rec
            if router is not None:
                router.done((rec.conv_id, rec.turn), rec.result, rec.kv_events)
            if on_done is not None:
                on_done(rec)

        spec = self.settings.workload
        for turns in schedule(spec.num_conversations, spec.num_turns, self.num_nodes):
            jobs: dict[int, list[tuple[int, int, list[int]]]] = {}
            for node, conv_id, turn in turns:
                prev = records.get((conv_id, turn - 1))
                history = [] if prev is None else prev.prompt_ids + prev.result.output_ids
                if router is not None:
                    node = router.route((conv_id, turn), history)
                jobs.setdefault(node, []).append((conv_id, turn, history))
            for node, batch in jobs.items():
                self._inboxes[node].put(("run", batch, max_new_tokens))
            ran = self._collect("ran", jobs, done)
            if router is not None:  # offloads that landed during the flush
                for events in ran.values():
                    router.ingest(events or [])
        for q in self._inboxes:
            q.put(("end",))
        return records, self._collect("ended", nodes)

