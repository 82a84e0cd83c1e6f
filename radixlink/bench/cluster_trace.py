"""Timed Mooncake-format requests for `radixlink bench cluster`: arrival times, lengths, block ids,
each prompt's tokens (built on demand) and its page hashes (computed once per trace).

Owns trace parsing with timestamps and prompt construction. Must not simulate anything.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from radixlink.hashing import page_hashes


@dataclass(frozen=True, slots=True)
class TimedRequest:
    """One trace line: arrival (seconds from the first request), prompt and output lengths, and
    one block id per ``block_size`` prompt tokens."""

    arrival_s: float
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...]


def parse_timed_trace(lines: Iterable[str], block_size: int, limit: int | None = None
                      ) -> list[TimedRequest]:
    """Requests of a Mooncake-format JSONL trace (``timestamp`` ms, ``input_length``,
    ``output_length``, ``hash_ids``), sorted by arrival, times relative to the first.

    Raises:
        ValueError: a line without those fields, a negative time, or a prompt longer than its
            blocks (usually a wrong ``--block-size``).
    """
    out: list[TimedRequest] = []
    for num, line in enumerate(lines, 1):
        if limit is not None and len(out) >= limit:
            break
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            req = TimedRequest(float(obj["timestamp"]) / 1000.0, int(obj["input_length"]),
                               int(obj.get("output_length", 0)),
                               tuple(int(i) for i in obj["hash_ids"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"trace line {num} is not a Mooncake record with a timestamp "
                             f"({exc!r})") from None
        if req.arrival_s < 0 or not 0 < req.input_len <= len(req.hash_ids) * block_size:
            raise ValueError(f"trace line {num}: timestamp {req.arrival_s * 1000:g} ms, "
                             f"input_length {req.input_len} with {len(req.hash_ids)} blocks of "
                             f"{block_size} tokens; check --block-size")
        out.append(req)
    out.sort(key=lambda r: r.arrival_s)
    first = out[0].arrival_s if out else 0.0
    return [TimedRequest(r.arrival_s - first, r.input_len, r.output_len, r.hash_ids)
            for r in out]


def load_timed_trace(path: str | Path, block_size: int, limit: int | None = None
                     ) -> list[TimedRequest]:
    with open(path, encoding="utf-8") as f:
        return parse_timed_trace(f, block_size, limit)


def prompt_tokens(req: TimedRequest, block_size: int) -> np.ndarray:
    """The request's tokens (uint32): block ``j`` opens with its id's low and high 32 bits and
    is zero after them, so equal ids give equal blocks and distinct ids differ at the block's
    first token. Cut to ``input_len``."""
    num_blocks = -(-req.input_len // block_size)
    ids = np.asarray(req.hash_ids[:num_blocks], dtype=np.uint64)
    tokens = np.zeros(num_blocks * block_size, dtype=np.uint32)
    tokens[0::block_size] = (ids & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    tokens[1::block_size] = (ids >> np.uint64(32)).astype(np.uint32)
    return tokens[: req.input_len]


def request_hashes(requests: Sequence[TimedRequest], block_size: int, page_size: int,
                   algo: str) -> list[list[str]]:
    """Per request, the chained page hashes of its whole pages (the cache's namespace-free
    chain, as an index-only ``UnifiedCache`` with hashing on computes them)."""
    return [page_hashes(prompt_tokens(r, block_size), page_size, None, algo=algo)
            for r in requests]
