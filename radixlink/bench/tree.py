"""`radixlink bench tree`: requests/s of the tree on a multi-turn chat workload, per phase,
for FULL-only and hybrid (SWA, MAMBA) trees side by side.

Owns only this benchmark; drives ``UnifiedCache`` through its public methods, indices only.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from radixlink.bench.common import add_common_args, machine_info, print_table, write_json
from radixlink.bench.workload import ChatRequest, WorkloadSpec, ideal_hit_tokens, make_workload
from radixlink.cache import UnifiedCache
from radixlink.cmdargs import CommandParser, int_at_least
from radixlink.config import CacheConfig
from radixlink.contract import InsertParams

PHASES = ("key", "match", "lock", "alloc", "insert", "free")


@dataclass(frozen=True, slots=True, kw_only=True)
class Hybrid:
    """Which hybrid components the tree gets, and their sizes."""

    swa: bool = False
    mamba: bool = False
    window: int = 1024
    swa_tokens: int | None = None  # None: the full capacity
    mamba_states: int = 1024

    @property
    def label(self) -> str:
        return "+".join(["full"] + ["swa"] * self.swa + ["mamba"] * self.mamba)


def run_once(
    requests: list[ChatRequest],
    page_size: int,
    capacity: int,
    policy: str = "lru",
    hybrid: Hybrid | None = None,
    check_inserts: bool = True,
) -> dict[str, Any]:
    """Replay ``requests`` through a fresh cache; wall time per phase and hit statistics.

    Per request: match -> lock -> alloc (evicting when short; plus a state slot with MAMBA)
    -> with SWA free the SWA pages that left the window -> insert(prompt + output,
    prev_prefix_len = hit, swa_evicted_seqlen, mamba_value) -> free the partial tail page
    (and the match's state copy) -> unlock.
    """
    hybrid = hybrid or Hybrid()
    cache = UnifiedCache(
        CacheConfig(
            page_size=page_size, num_tokens=capacity, eviction_policy=policy,
            sliding_window=hybrid.window if hybrid.swa else None,
            swa_num_tokens=hybrid.swa_tokens if hybrid.swa else None,
            mamba_num_states=hybrid.mamba_states if hybrid.mamba else None,
            check_inserts=check_inserts,
        )
    )
    ps, swa, mamba, window = page_size, hybrid.swa, hybrid.mamba, hybrid.window
    t_key = t_match = t_lock = t_alloc = t_insert = t_free = 0.0
    hit_total = prompt_total = 0
    clock = time.perf_counter
    start = clock()
    for req in requests:
        t0 = clock()
        prompt = req.prompt
        seq = prompt + req.output
        t1 = clock()
        m = cache.match_prefix(prompt)
        t2 = clock()
        hit = m.prefix_len
        handle = cache.lock(m.last_node)
        copy = cache.hybrid.copy_state(m.last_node) if mamba and hit else None  # copy-on-write
        t3 = clock()
        new = cache.alloc(len(seq) - hit)
        assert new is not None, "allocation failed after eviction: capacity below one request"
        kv = torch.cat([m.device_indices, new]) if hit else new
        state = cache.hybrid.alloc_state() if mamba else None
        t4 = clock()
        aligned = len(seq) // ps * ps
        evicted = max(hit, (aligned - window) // ps * ps) if swa else 0
        if evicted > hit:  # the engine dropped the SWA pages that left the window
            cache.hybrid.free_swa(kv[hit:evicted])
        cache.insert(InsertParams(key=seq, value=kv[:aligned], prev_prefix_len=hit,
                                  swa_evicted_seqlen=evicted, mamba_value=state))
        t5 = clock()
        if len(kv) > aligned:
            cache.free(kv[aligned:])
        if copy is not None:
            cache.hybrid.free_state(copy)
        t6 = clock()
        cache.unlock(handle)
        t7 = clock()
        t_key += t1 - t0
        t_match += t2 - t1
        t_lock += (t3 - t2) + (t7 - t6)
        t_alloc += t4 - t3
        t_insert += t5 - t4
        t_free += t6 - t5
        hit_total += hit
        prompt_total += len(prompt)
    wall = clock() - start
    stats = cache.stats()
    held = [stats.get(k, 0) for k in ("held_tokens", "swa_held_tokens", "mamba_held_states")]
    assert stats["num_locks"] == 0 and not any(held), f"leak after the run: {stats}"
    phases = dict(zip(PHASES, (t_key, t_match, t_lock, t_alloc, t_insert, t_free), strict=True))
    return {
        "wall_s": wall,
        "hit_rate": hit_total / prompt_total,
        "evicted_tokens": stats["evicted_tokens"],
        "cached_tokens": stats["cached_tokens"],
        "num_nodes": stats["num_nodes"],
        "phases_s": phases,
    }


def _row(
    label: str, page_size: int, capacity: int, runs: list[dict[str, Any]], n: int
) -> dict[str, Any]:
    walls = [r["wall_s"] for r in runs]
    median = sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]
    row: dict[str, Any] = {
        "components": label,
        "page": page_size,
        "capacity": capacity,
        "req/s": n / median["wall_s"],
        "best req/s": n / min(walls),
        "hit": round(median["hit_rate"], 3),
        "evicted": median["evicted_tokens"],
    }
    for phase, seconds in median["phases_s"].items():
        row[f"{phase} us"] = round(seconds / n * 1e6, 1)
    row["total us"] = round(median["wall_s"] / n * 1e6, 1)
    return row


def _positive_ints(text: str) -> list[int]:
    """An argparse ``type``: a comma list of ints >= 1."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected a comma list of ints >= 1, got {text!r}")
    return values


def main(argv: list[str]) -> int:
    positive = int_at_least(1)
    parser = CommandParser(prog="radixlink bench tree", description=__doc__)
    parser.add_argument("--requests", type=positive, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--page-size", type=_positive_ints, default="1,16",
                        help="comma-separated page sizes")
    parser.add_argument("--capacity", type=_positive_ints, default="65536,262144,2097152",
                        help="tokens, comma list")
    parser.add_argument("--reps", type=positive, default=3, help="runs per config (median shown)")
    parser.add_argument("--policy", choices=("lru", "lfu"), default="lru")
    parser.add_argument("--threads", type=positive, default=1, help="torch intra-op threads")
    parser.add_argument("--profile", action="store_true", help="cProfile one run per config")
    parser.add_argument(
        "--components", default="full",
        help="comma list from full,swa,mamba: FULL-only always runs, plus every hybrid tree "
        "the listed components make (full,swa,mamba: +swa, +mamba, +swa+mamba)",
    )
    parser.add_argument("--window", type=positive, default=1024, help="SWA window (tokens)")
    parser.add_argument("--swa-tokens", type=positive, default=None,
                        help="SWA pool (default: capacity)")
    parser.add_argument("--mamba-states", type=positive, default=1024, help="Mamba state slots")
    parser.add_argument("--insert-checks", choices=("on", "off", "both"), default="on",
                        help="validate insert slots (CacheConfig.check_inserts); 'both' runs "
                        "each config with and without, side by side")
    add_common_args(parser)
    args = parser.parse_args(argv)
    hybrids = _hybrids(parser, args)
    torch.set_num_threads(args.threads)
    page_sizes, capacities = args.page_size, args.capacity
    requests = make_workload(WorkloadSpec(num_requests=args.requests, seed=args.seed))
    prompt_tokens = sum(len(r.prompt) for r in requests)
    print(
        f"tree bench: {len(requests)} requests, {prompt_tokens:,} prompt tokens, seed "
        f"{args.seed}, policy {args.policy}, {args.reps} runs per config (median), "
        f"torch threads {args.threads}, trees {', '.join(h.label for h in hybrids)}"
        + (f", window {args.window}" if any(h.swa for h in hybrids) else "")
    )
    checks_modes = {"on": (True,), "off": (False,), "both": (True, False)}[args.insert_checks]
    for hybrid in hybrids:  # warm-up
        run_once(requests[:200], page_sizes[0], capacities[0], args.policy, hybrid)
    rows, results = [], []
    for ps in page_sizes:
        ideal = ideal_hit_tokens(requests, ps) / prompt_tokens
        for cap in capacities:
            base = 0.0
            for hybrid in hybrids:
                if args.profile:
                    _profile(requests, ps, cap, args.policy, hybrid)
                # NOTE: modes interleave run by run, so the machine's drift hits them alike
                runs: dict[bool, list[dict[str, Any]]] = {mode: [] for mode in checks_modes}
                for _ in range(args.reps):
                    for mode in checks_modes:
                        runs[mode].append(run_once(requests, ps, cap, args.policy, hybrid,
                                                   mode))
                for checks in checks_modes:
                    label = hybrid.label + ("" if len(checks_modes) == 1 else
                                            f" checks {'on' if checks else 'off'}")
                    row = _row(label, ps, cap, runs[checks], len(requests))
                    row["ideal hit"] = round(ideal, 3)
                    base = base or row["req/s"]
                    row["vs full"] = round(row["req/s"] / base, 2)
                    rows.append(row)
                    results.append({"page_size": ps, "capacity": cap,
                                    "components": hybrid.label, "check_inserts": checks,
                                    "row": row, "runs": runs[checks]})
    print_table(rows, "per request: match -> lock -> alloc -> insert -> free tail -> unlock")
    spread = [r["best req/s"] / r["req/s"] - 1 for r in rows]
    print(f"best run within {100 * statistics.mean(spread):.1f}% of the median on average")
    if args.json:
        write_json(
            args.json,
            {"bench": "tree", "machine": machine_info(), "args": vars(args), "results": results},
        )
    return 0


def _hybrids(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Hybrid]:
    """FULL-only first, then each hybrid tree the ``--components`` list makes."""
    names = {x.strip() for x in args.components.split(",") if x.strip()}
    unknown = names - {"full", "swa", "mamba"}
    if unknown:
        parser.error(f"--components: unknown {sorted(unknown)}; use full, swa, mamba")
    sizes = {"window": args.window, "swa_tokens": args.swa_tokens,
             "mamba_states": args.mamba_states}
    out = [Hybrid(**sizes)]
    for swa, mamba in ((True, False), (False, True), (True, True)):
        if (not swa or "swa" in names) and (not mamba or "mamba" in names):
            out.append(Hybrid(swa=swa, mamba=mamba, **sizes))
    return out


def _profile(
    requests: list[ChatRequest], page_size: int, capacity: int, policy: str, hybrid: Hybrid
) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    run_once(requests, page_size, capacity, policy, hybrid)
    profiler.disable()
    print(f"--- profile {hybrid.label} page {page_size} capacity {capacity}")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(18)
