"""Seeded Mooncake-format traces for `radixlink bench cluster --trace gen:KEY=VALUE,...`: the
same request mix at chosen prefix reuse, arrival burstiness and rate, so a policy is checked
on workloads it was not tuned on (docs/routing.md, "Generated traces").

Owns the generator and its spec string. Must not simulate or route anything.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

from radixlink.bench.cluster_trace import TimedRequest, parse_timed_trace

PREFIX = "gen:"
MAX_PROMPT = 131072  # tokens; a conversation that would grow past this ends


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceSpec:
    """What `generate` draws.

    Attributes:
        requests: how many requests.
        rate: mean arrivals per second.
        burst: coefficient of variation of the gaps between arrivals (gamma-distributed):
            1 is a Poisson process, larger values bunch arrivals into bursts.
        reuse: probability that a request extends a shared history (a document many requests
            open with, or an earlier turn of its conversation) instead of being all new.
        prompt: mean length in tokens of an all-new prompt and of a shared document.
        docs: shared documents; their popularity is Zipf(1.1), so a few are hot.
        seed: seeds every draw; the same spec gives the same trace.
    """

    requests: int = 3000
    rate: float = 4.0
    burst: float = 1.0
    reuse: float = 0.7
    prompt: int = 12000
    docs: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        bad = [(name, value, need) for name, value, need in (
            ("requests", self.requests, self.requests >= 2),
            ("rate", self.rate, 0 < self.rate < math.inf),
            ("burst", self.burst, 0 < self.burst < math.inf),
            ("reuse", self.reuse, 0 <= self.reuse <= 1),
            ("prompt", self.prompt, 1 <= self.prompt <= MAX_PROMPT),
            ("docs", self.docs, self.docs >= 1),
            ("seed", self.seed, self.seed >= 0)) if not need]
        if bad:
            name, value, _ = bad[0]
            raise ValueError(f"trace spec: {name}={value!r} is out of range (requests >= 2, "
                             "rate and burst > 0, 0 <= reuse <= 1, 1 <= prompt <= "
                             f"{MAX_PROMPT}, docs >= 1, seed >= 0)")

    @classmethod
    def parse(cls, spec: str) -> TraceSpec:
        """``gen:reuse=0.5,burst=4,seed=1`` (any subset of the attributes; the rest default).

        Raises:
            ValueError: not ``gen:``, an unknown key or a value that is not a number.
        """
        if not spec.startswith(PREFIX):
            raise ValueError(f"a generated trace spec starts with {PREFIX!r}, got {spec!r}")
        types = {f.name: f.type for f in fields(cls)}
        kw: dict[str, Any] = {}
        for item in filter(None, spec[len(PREFIX):].split(",")):
            key, eq, value = item.partition("=")
            if key not in types or not eq:
                raise ValueError(f"trace spec {spec!r}: {item!r} is not KEY=VALUE with KEY one "
                                 f"of {', '.join(types)}")
            try:
                kw[key] = float(value) if types[key] == "float" else int(value)
            except ValueError:
                raise ValueError(f"trace spec {spec!r}: {key}={value!r} is not a "
                                 f"{types[key]}") from None
        return cls(**kw)


def generate(spec: TraceSpec, block_size: int) -> Iterator[dict[str, Any]]:
    """The trace's Mooncake-format records (``timestamp`` ms, ``input_length``,
    ``output_length``, ``hash_ids`` of ``block_size`` tokens each), in arrival order.

    A request is all new with probability ``1 - reuse``; otherwise it opens a new conversation
    on a shared document (half the time while conversations are live) or extends a live one by
    a turn. A later turn keeps the full blocks of its conversation's previous prompt, as a chat
    engine's prompt does; a partly filled last block gets a new id, so it is not shared.
    """
    rng = random.Random(spec.seed)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    bs = block_size
    next_id = 0

    def new_ids(n: int) -> list[int]:
        nonlocal next_id
        next_id += n
        return list(range(next_id - n, next_id))

    def length(mean: float) -> int:  # log-normal, sigma 1, with the given mean
        return max(16, min(MAX_PROMPT, int(rng.lognormvariate(math.log(mean) - 0.5, 1.0))))

    def extend(ids: list[int], full: int, new: int) -> list[int]:  # keep ``full`` tokens' blocks
        kept = ids[: full // bs]
        return kept + new_ids(-(-new // bs) - len(kept))

    docs = [new_ids(-(-n // bs)) for n in (length(spec.prompt) // bs * bs or bs
                                           for _ in range(spec.docs))]
    weights = [1.0 / (k + 1) ** 1.1 for k in range(spec.docs)]
    live: list[tuple[list[int], int, int]] = []  # conversations: ids, prompt, + the reply
    shape = 1.0 / spec.burst ** 2  # gamma gaps: mean 1 / rate, coefficient of variation burst
    t = 0.0
    for _ in range(spec.requests):
        if rng.random() >= spec.reuse:
            n = length(spec.prompt)
            ids, conv = new_ids(-(-n // bs)), None
        elif live and rng.random() < 0.5:
            conv = rng.randrange(len(live))
            ids, prompt, old = live[conv]
            n = min(MAX_PROMPT, old + length(spec.prompt / 20))
            ids = extend(ids, prompt, n)
        else:
            doc = rng.choices(docs, weights)[0]
            old = len(doc) * bs
            n = min(MAX_PROMPT, old + length(spec.prompt / 10))
            ids, conv = extend(doc, old, n), len(live)
            live.append((ids, n, n))
        out = rng.randint(16, 512)
        yield {"timestamp": round(t * 1000.0, 3), "input_length": n, "output_length": out,
               "hash_ids": ids}
        if conv is not None:
            if n + out >= MAX_PROMPT or rng.random() < 0.15:  # about 7 turns per conversation
                live.pop(conv)
            else:
                live[conv] = (ids, n, n + out)
        t += rng.gammavariate(shape, 1.0 / (spec.rate * shape))


def generated_requests(spec: str, block_size: int, limit: int | None = None
                       ) -> list[TimedRequest]:
    """`generate` for a ``gen:`` spec, parsed as a trace file would be (``limit``: the first
    requests only)."""
    lines = (json.dumps(r) for r in generate(TraceSpec.parse(spec), block_size))
    return parse_timed_trace(lines, block_size, limit)
