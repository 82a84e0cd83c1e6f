"""`radixlink bench trace --trace FILE.jsonl`: replay a Mooncake-format trace through the real
tree (and, in shared mode, one shared store through the real linker); hit ratio vs capacity.

Owns trace parsing, deterministic block tokens, routing and the replay loop. Drives
``UnifiedCache`` / ``ExternalCacheLinker`` through their public methods only.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from radixlink.bench.cluster_trace import parse_records
from radixlink.bench.common import machine_info, parse_tokens, print_table, write_json
from radixlink.bench.trace_replay import ReplayConfig, replay
from radixlink.cmdargs import CommandParser, int_at_least

# NOTE: Llama-3.1-8B in bf16: 32 layers x 8 KV heads x 128 head dim x (K, V) x 2 bytes.
REF_MODEL = "Llama-3.1-8B bf16 (32 layers x 8 KV heads x 128 dim x K,V x 2 B)"
REF_BYTES_PER_TOKEN = 131072
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One trace line: the prompt length and its block ids (one per ``block_size`` tokens)."""

    input_len: int
    hash_ids: tuple[int, ...]


def parse_trace(lines: Iterable[str], block_size: int, limit: int | None = None
                ) -> list[TraceRequest]:
    """Requests of a Mooncake-format JSONL trace (``input_length``, ``hash_ids``; no timestamp
    needed), read by `parse_records`, which raises the format's errors."""
    return [TraceRequest(r.input_len, r.hash_ids)
            for r in parse_records(lines, block_size, limit, timed=False)]


def load_trace(path: str | Path, block_size: int, limit: int | None = None
               ) -> list[TraceRequest]:
    with open(path, encoding="utf-8") as f:
        return parse_trace(f, block_size, limit)


class BlockTokens:
    """Deterministic tokens for block ids: equal ids give equal blocks, distinct ids distinct
    blocks (splitmix64 of ``id * block_size + offset``, top 32 bits). Each id's block is
    built once, vectorized, and kept."""

    def __init__(self, block_size: int, seed: int = 0):
        self.block_size = block_size
        self.seed = np.uint64(seed)
        self._blocks: dict[int, np.ndarray] = {}

    def prepare(self, requests: Iterable[TraceRequest]) -> None:
        """Build every block the requests need (so replays time only the cache)."""
        new = sorted({i for r in requests for i in r.hash_ids} - self._blocks.keys())
        for start in range(0, len(new), 8192):
            ids = np.asarray(new[start : start + 8192], dtype=np.uint64)
            for block_id, row in zip(ids.tolist(), self._make(ids)):
                self._blocks[block_id] = row

    def prompt(self, req: TraceRequest) -> np.ndarray:
        """The request's tokens: its blocks joined, cut to ``input_len`` (uint32)."""
        num_blocks = -(-req.input_len // self.block_size)
        ids = req.hash_ids[:num_blocks]
        missing = [i for i in ids if i not in self._blocks]
        if missing:
            self.prepare([TraceRequest(0, tuple(missing))])
        return np.concatenate([self._blocks[i] for i in ids])[: req.input_len]

    def _make(self, ids: np.ndarray) -> np.ndarray:
        offsets = np.arange(self.block_size, dtype=np.uint64)
        z = ids[:, None] * np.uint64(self.block_size) + offsets + (self.seed << np.uint64(40))
        z += _MIX[0]
        z = (z ^ (z >> np.uint64(30))) * _MIX[1]
        z = (z ^ (z >> np.uint64(27))) * _MIX[2]
        z ^= z >> np.uint64(31)
        return (z >> np.uint64(32)).astype(np.uint32)


def upper_bound_hit_tokens(requests: Iterable[TraceRequest], block_size: int) -> int:
    """The trace's own bound: per request, the leading run of full blocks already seen as full
    blocks of earlier prompts, in tokens (an unbounded cache inserting prompts after serving)."""
    seen: set[int] = set()
    total = 0
    for req in requests:
        full = req.hash_ids[: req.input_len // block_size]
        run = 0
        for block_id in full:
            if block_id not in seen:
                break
            run += 1
        total += run * block_size
        seen.update(full)
    return total


def route_requests(requests: list[TraceRequest], num_nodes: int, policy: str,
                   prefix_blocks: int = 2) -> list[int]:
    """Node of each request: ``round-robin``, or ``hash`` of the first ``prefix_blocks`` block
    ids (prefix-affine routing: turns of one conversation share their opening blocks)."""
    if policy == "round-robin":
        return [i % num_nodes for i in range(len(requests))]
    if policy == "hash":
        return [hash(r.hash_ids[:prefix_blocks]) % num_nodes for r in requests]
    raise ValueError(f"route must be 'round-robin' or 'hash', got {policy!r}")


def synthetic_trace(num_requests: int, *, block_size: int = 512, seed: int = 0,
                    num_system: int = 4, num_active: int = 16) -> Iterator[dict[str, Any]]:
    """A Mooncake-format multi-turn chat trace: shared system prompts, growing conversations,
    chained block ids (a turn keeps the full blocks of the previous prompt), partial tails."""
    rng = random.Random(seed)
    next_id = 0

    def new_ids(n: int) -> list[int]:
        nonlocal next_id
        next_id += n
        return list(range(next_id - n, next_id))

    systems = [(new_ids(k), k * block_size)
               for k in (rng.randint(1, 3) for _ in range(num_system))]
    # (ids, tokens of the last prompt, + its reply, turns left)
    convs: list[tuple[list[int], int, int, int]] = []
    for num in range(num_requests):
        if len(convs) < num_active or rng.random() < 0.1:
            sys_ids, sys_len = systems[rng.randrange(num_system)]
            convs.append((list(sys_ids), sys_len, sys_len, rng.randint(1, 8)))
        pos = rng.randrange(len(convs))
        ids, prompt, length, left = convs[pos]
        new_len = length + rng.randint(block_size // 4, 3 * block_size)
        # NOTE: only the previous prompt's full blocks: its partial last block is filled by the
        # reply now, other content, so it gets a new id
        kept = ids[: prompt // block_size]
        ids = kept + new_ids(-(-new_len // block_size) - len(kept))
        yield {"timestamp": num * 10, "input_length": new_len,
               "output_length": rng.randint(16, 256), "hash_ids": ids}
        reply = rng.randint(16, 256)
        if left <= 1:
            convs.pop(pos)
        else:
            convs[pos] = (ids, new_len, new_len + reply, left - 1)


def _split(values: list[str] | None, default: str) -> list[str]:
    return [v for item in (values or [default]) for v in item.split(",") if v.strip()]


def _parser() -> argparse.ArgumentParser:
    positive = int_at_least(1)
    p = CommandParser(prog="radixlink bench trace", description=__doc__)
    p.add_argument("--trace", required=True, help="Mooncake-format JSONL trace")
    p.add_argument("--page-size", type=positive, default=16)
    p.add_argument("--block-size", type=positive, default=512, help="tokens per trace hash id")
    p.add_argument("--capacity", action="append", metavar="TOKENS|inf",
                   help="device capacity per node (repeatable or comma list; default inf)")
    p.add_argument("--nodes", action="append", type=positive, help="engine nodes (repeatable)")
    p.add_argument("--route", choices=("round-robin", "hash"), default="round-robin")
    p.add_argument("--mode", action="append", choices=("local", "shared", "both"),
                   help="local device caches, or + one shared store (default both)")
    p.add_argument("--store-capacity", default="inf", metavar="TOKENS|inf")
    p.add_argument("--limit", type=positive, default=None, help="first N requests only")
    p.add_argument("--hash-algo", choices=("sha256", "xxh3"), default="sha256")
    p.add_argument("--ref-bytes-per-token", type=positive, default=REF_BYTES_PER_TOKEN,
                   help=f"bytes per token for 'bytes that would move' (default: {REF_MODEL})")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="seed of the block tokens")
    p.add_argument("--threads", type=positive, default=1, help="torch intra-op threads")
    p.add_argument("--json", metavar="PATH", default=None)
    p.add_argument("--plot", metavar="PATH", default=None, help="PNG: hit ratio vs capacity")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)  # NOTE: small index tensors; thread handoffs cost more
    ps = args.page_size
    nodes_list = args.nodes or [1]
    if min(ps, args.block_size, *nodes_list) <= 0 or (args.limit is not None and args.limit <= 0):
        parser.error("--page-size, --block-size, --nodes and --limit must be positive")
    try:
        caps = [parse_tokens(c) for c in _split(args.capacity, "inf")]
        store_cap = parse_tokens(args.store_capacity)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    caps = [None if c is None else max(ps, c // ps * ps) for c in caps]
    modes: list[str] = []
    for mode in _split(args.mode, "both"):
        modes += [m for m in (("local", "shared") if mode == "both" else (mode,)) if m not in modes]
    requests = load_trace(args.trace, args.block_size, args.limit)
    if not requests:
        parser.error(f"{args.trace} holds no requests")
    input_tokens = sum(r.input_len for r in requests)
    bound = upper_bound_hit_tokens(requests, args.block_size)
    tokens = BlockTokens(args.block_size, args.seed)
    start = time.perf_counter()
    tokens.prepare(requests)
    print(
        f"trace bench: {args.trace}: {len(requests):,} requests, {input_tokens:,} input tokens, "
        f"block {args.block_size}, page {ps}, route {args.route}, store capacity "
        f"{args.store_capacity}, hash {args.hash_algo}; upper bound {bound:,} tokens = "
        f"{bound / input_tokens:.4f}; blocks built in {time.perf_counter() - start:.1f}s; "
        f"bytes at {args.ref_bytes_per_token:,} B/token ({REF_MODEL})"
    )
    results = []
    for nodes in nodes_list:
        for cap in caps:
            for mode in modes:
                cfg = ReplayConfig(page_size=ps, capacity=cap, nodes=nodes, route=args.route,
                                   mode=mode, store_capacity=store_cap,
                                   hash_algo=args.hash_algo,
                                   ref_bytes_per_token=args.ref_bytes_per_token)
                routes = route_requests(requests, nodes, args.route)
                row = replay(requests, routes, tokens, cfg, progress=not args.no_progress)
                row["upper_bound"] = bound / input_tokens
                results.append(row)
    _print(results)
    if args.json:
        write_json(args.json, {
            "bench": "trace", "machine": machine_info(), "trace": str(args.trace),
            "config": {k: v for k, v in vars(args).items() if k not in ("json", "plot")},
            "reference_layout": REF_MODEL, "upper_bound_hit_tokens": bound,
            "input_tokens": input_tokens, "results": results,
        })
    if args.plot:
        from radixlink.bench.trace_replay import plot_hit_ratio

        plot_hit_ratio(results, args.plot, title=f"{Path(args.trace).name}: page {ps}, "
                       f"block {args.block_size}, route {args.route}")
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _print(results: list[dict[str, Any]]) -> None:
    rows = [{
        "nodes": r["nodes"], "capacity": r["capacity_tokens"] or "inf", "mode": r["mode"],
        "requests": r["requests"], "device hit": r["device_hit_tokens"],
        "store hit": r["store_hit_tokens"], "hit ratio": f"{r['hit_ratio']:.4f}",
        "bound": f"{r['upper_bound']:.4f}", "load GB": round(r["load_bytes"] / 1e9, 1),
        "offload GB": round(r["offload_bytes"] / 1e9, 1),
        "offload pages/req": round(r.get("offloaded_pages_per_request", 0.0), 2),
        "wall s": round(r["wall_s"], 1),
        "req/s": round(r["requests_per_s"]),
    } for r in results]
    print_table(rows, "hit tokens per configuration (capacity = device tokens per node)")
