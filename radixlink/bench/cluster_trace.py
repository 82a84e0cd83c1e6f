"""Timed Mooncake-format requests for `radixlink bench cluster`: arrival times, lengths, block ids,
each prompt's tokens (built on demand) and its page hashes (computed once per trace).

Owns Mooncake-format trace parsing (`bench trace` reads through it too) and prompt
construction. Must not simulate anything.
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


def parse_records(lines: Iterable[str], block_size: int, limit: int | None = None, *,
                  timed: bool = True) -> list[TimedRequest]:
    """The Mooncake-format JSONL records (``timestamp`` ms, ``input_length``, ``output_length``,
    ``hash_ids``) in file order, arrival times as written; ``timed=False`` needs no
    ``timestamp`` (arrivals are then 0). The one parser of the format: `bench trace` and
    `bench cluster` both read through it.

    Raises:
        ValueError: a line without those fields, a negative time, or a prompt longer than its
            blocks (usually a wrong ``--block-size``).
    """
    what = "a Mooncake record with a timestamp" if timed else "a Mooncake record"
    out: list[TimedRequest] = []
    for num, line in enumerate(lines, 1):
        if limit is not None and len(out) >= limit:
            break
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            arrival_s = float(obj["timestamp"]) / 1000.0 if timed else 0.0
            req = TimedRequest(arrival_s, int(obj["input_length"]),
                               int(obj.get("output_length", 0)),
                               tuple(int(i) for i in obj["hash_ids"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"trace line {num} is not {what} ({exc!r})") from None
        if req.arrival_s < 0 or not 0 < req.input_len <= len(req.hash_ids) * block_size:
            at = f"timestamp {req.arrival_s * 1000:g} ms, " if timed else ""
            raise ValueError(f"trace line {num}: {at}input_length {req.input_len} with "
                             f"{len(req.hash_ids)} blocks of {block_size} tokens; "
                             "check --block-size")
        out.append(req)
    return out


def parse_timed_trace(lines: Iterable[str], block_size: int, limit: int | None = None
                      ) -> list[TimedRequest]:
    """`parse_records`, sorted by arrival, times relative to the first request."""
    out = sorted(parse_records(lines, block_size, limit), key=lambda r: r.arrival_s)
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
