"""`radixlink bench e2e`: the reference engine on the multi-turn chat workload over N node
processes, cache off vs device cache only vs device cache + shared store, side by side.

Owns only this benchmark (its table, JSON and TTFT CDF plot); the nodes and the engine do the
work through the public cache and linker API.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from radixlink.bench.common import add_common_args, machine_info, print_table, write_json
from radixlink.cmdargs import CommandParser, int_at_least
from radixlink.engine.demo import percentile, progress
from radixlink.engine.nodes import NodePool, NodeSettings, TurnRecord
from radixlink.engine.weights import MODEL_NAMES
from radixlink.engine.workload import WorkloadSpec

LABELS = {"off": "cache off", "device": "device only", "store": "device + shared store"}


def summarize(mode: str, records: Sequence[TurnRecord], wall_s: float,
              reference: dict[tuple[int, int], list[int]]) -> dict[str, Any]:
    """One result row for ``mode``: TTFT percentiles, prefill work, throughput, identity."""
    res = [r.result for r in records]
    ttft = [r.ttft_s for r in res]
    same = sum(1 for r in records if reference.get((r.conv_id, r.turn)) == r.result.output_ids)
    return {
        "mode": mode, "requests": len(res),
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "prefill_tokens": sum(r.num_computed for r in res),
        "device_tokens": sum(r.num_from_device for r in res),
        "store_tokens": sum(r.num_from_store for r in res),
        "loaded_mib": sum(r.loaded_bytes for r in res) / 2**20,
        "wall_s": wall_s, "requests_per_s": len(res) / wall_s if wall_s else 0.0,
        "output_tokens_per_s": sum(len(r.output_ids) for r in res) / wall_s if wall_s else 0.0,
        "identical": f"{same}/{len(res)}",
        "ttft_s": sorted(ttft),
    }


def plot_cdf(results: Sequence[dict[str, Any]], path: str, title: str) -> None:
    """TTFT CDF per mode (log x), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in results:
        xs = [row["ttft_s"][0], *row["ttft_s"]]  # the curve starts at 0
        ys = [i / (len(xs) - 1) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=f"{LABELS[row['mode']]} "
                f"(p50 {row['ttft_p50_s']:.2f} s)")
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _parser() -> argparse.ArgumentParser:
    positive = int_at_least(1)
    p = CommandParser(prog="radixlink bench e2e", description=__doc__)
    p.add_argument("--nodes", type=positive, default=2)
    p.add_argument("--model", choices=MODEL_NAMES, default="smollm2-135m")
    p.add_argument("--conversations", type=positive, default=4)
    p.add_argument("--turns", type=positive, default=3)
    p.add_argument("--max-new-tokens", type=positive, default=8)
    p.add_argument("--context-tokens", type=positive, default=1100)
    p.add_argument("--system-prompts", type=positive, default=2)
    p.add_argument("--store", default=None, help="shared store URL (default: a fresh "
                   "directory store in a temp dir)")
    p.add_argument("--page-size", type=positive, default=16)
    p.add_argument("--device-tokens", type=positive, default=16384)
    p.add_argument("--threads", type=int_at_least(0), default=0, help="torch threads per node")
    p.add_argument("--modes", default="off,device,store", help="comma-separated subset")
    p.add_argument("--plot", metavar="PATH", default=None, help="PNG of TTFT CDFs")
    return add_common_args(p)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in LABELS for m in modes):
        print(f"--modes must be a subset of {','.join(LABELS)}", file=sys.stderr)
        return 2
    tmp = None if args.store else tempfile.mkdtemp(prefix="radixlink-e2e-")
    store = args.store or f"file://{tmp}?capacity=4GiB"
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.nodes)
    workload = WorkloadSpec(num_conversations=args.conversations, num_turns=args.turns,
                            num_system_prompts=args.system_prompts,
                            context_tokens=args.context_tokens)
    settings = NodeSettings(model=args.model, workload=workload,
                            store_urls=(store,) * args.nodes, num_tokens=args.device_tokens,
                            page_size=args.page_size, num_threads=threads)
    config = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    print(f"bench e2e: {config}, {threads} threads per node")
    results: list[dict[str, Any]] = []
    try:
        with NodePool(settings, args.nodes) as pool:
            reference: dict[tuple[int, int], list[int]] = {}
            for mode in modes:
                with progress(args.conversations * args.turns, LABELS[mode]) as update:
                    start = time.perf_counter()
                    records, _ = pool.run(mode, args.max_new_tokens, update)
                    wall = time.perf_counter() - start
                if not reference:
                    reference = {k: r.result.output_ids for k, r in records.items()}
                results.append(summarize(mode, list(records.values()), wall, reference))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    rows = [{"mode": LABELS[r["mode"]], "requests": r["requests"],
             "TTFT p50 s": r["ttft_p50_s"], "TTFT p99 s": r["ttft_p99_s"],
             "prefill tok": r["prefill_tokens"], "device tok": r["device_tokens"],
             "store tok": r["store_tokens"], "req/s": r["requests_per_s"],
             "out tok/s": r["output_tokens_per_s"], "wall s": r["wall_s"],
             f"same as {LABELS[modes[0]]}": r["identical"]} for r in results]
    print_table(rows, f"TTFT and prefill work, {args.nodes} nodes, model {args.model}")
    if args.json:
        write_json(args.json, {"config": config, "machine": machine_info(), "results": results})
    if args.plot:
        plot_cdf(results, args.plot, f"TTFT, {args.conversations} conversations x "
                 f"{args.turns} turns on {args.nodes} nodes ({args.model})")
        print(f"wrote {args.plot}", file=sys.stderr)
    identical = all(r["identical"] == f"{r['requests']}/{r['requests']}" for r in results)
    return 0 if identical else 1
