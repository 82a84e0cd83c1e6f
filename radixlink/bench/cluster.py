"""`radixlink bench cluster --trace FILE.jsonl`: replay a Mooncake-format trace over N simulated
prefill nodes (real trees, a real store, a real router) under each routing policy at several
request rates; TTFT, SLO attainment, goodput, prefill saved and bytes moved, with plots.

Owns the command line and the run grid. The simulation is cluster_sim.py; the metrics and
plots cluster_report.py; the timing model and its sources are in docs/routing.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from radixlink.bench.cluster_gen import PREFIX, generated_requests
from radixlink.bench.cluster_report import aggregate, plot, summarize, table_rows, verdicts
from radixlink.bench.cluster_sim import ClusterConfig, Timing, simulate
from radixlink.bench.cluster_trace import load_timed_trace, request_hashes
from radixlink.bench.common import machine_info, parse_tokens, print_table, write_json
from radixlink.cmdargs import CommandParser, int_at_least, number_in
from radixlink.cost import HIDE, GpuSpec, ModelShape, TransferEstimate, prefill_estimate
from radixlink.cost.reference import H100_SXM, LLAMA3_8B
from radixlink.routing import policy_names


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 2,3,4, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative numbers, got {text!r}")
    return values


def _parser() -> argparse.ArgumentParser:
    positive, above_zero = int_at_least(1), number_in(0, low_open=True)
    p = CommandParser(prog="radixlink bench cluster", description=__doc__)
    a = p.add_argument
    a("--trace", required=True,
      help="Mooncake-format JSONL trace, or a generated one: gen:KEY=VALUE,... with keys of "
           "radixlink.bench.cluster_gen.TraceSpec (e.g. gen:reuse=0.5,burst=4,seed=1)")
    a("--limit", type=positive, default=None, help="first N requests only")
    a("--block-size", type=positive, default=512, help="tokens per trace hash id")
    a("--page-size", type=positive, default=512)
    a("--nodes", type=positive, default=8, help="prefill nodes")
    a("--device-tokens", default="400K", help="device KV capacity per node (tokens)")
    a("--store-tokens", default="inf", help="store capacity in tokens (LRU) or inf")
    a("--rate-scale", type=_floats, default=[2.0, 3.0, 4.0],
      help="arrival speed-ups of the trace (comma list; 2 = twice the trace's rate)")
    a("--policies", default=",".join(policy_names()), help="comma list of routing policies")
    a("--baseline-loads", choices=("always", "cost"), default="always",
      help="what nodes of the baseline policies load: everything restorable (engines "
           "today) or what the cost model picks; radixlink nodes always use the cost model")
    a("--slo-ttft", type=above_zero, default=2.0,
      help="TTFT target (s) for attainment and goodput")
    g = p.add_argument_group("model (default Llama-3-8B, bf16)")
    g.add_argument("--model-name", default=LLAMA3_8B.name)
    g.add_argument("--params", type=above_zero, default=LLAMA3_8B.num_params)
    g.add_argument("--vocab", type=positive, default=LLAMA3_8B.vocab_size)
    g.add_argument("--hidden", type=positive, default=LLAMA3_8B.hidden_size)
    g.add_argument("--layers", type=positive, default=LLAMA3_8B.num_layers)
    g.add_argument("--heads", type=positive, default=LLAMA3_8B.num_heads)
    g.add_argument("--kv-heads", type=positive, default=LLAMA3_8B.num_kv_heads)
    g.add_argument("--head-dim", type=positive, default=LLAMA3_8B.head_dim)
    g.add_argument("--dtype-bytes", type=positive, default=LLAMA3_8B.dtype_bytes)
    g = p.add_argument_group("GPU and links (default H100 SXM5; store over 100 GbE)")
    g.add_argument("--gpu-name", default=H100_SXM.name)
    g.add_argument("--peak-tflops", type=above_zero, default=H100_SXM.peak_flops / 1e12)
    g.add_argument("--gemm-mfu", type=number_in(0, 1, low_open=True), default=0.6)
    g.add_argument("--attn-mfu", type=number_in(0, 1, low_open=True), default=0.5)
    g.add_argument("--pass-overhead-ms", type=number_in(0), default=5.0)
    g.add_argument("--store-gbps", type=_floats, default=[10.0],
                   help="store -> device GB/s (comma list of tiers to compare; 0 = no store)")
    g.add_argument("--store-latency-ms", type=number_in(0), default=1.0)
    g.add_argument("--peer-gbps", type=number_in(0), default=None,
                   help="device -> device GB/s between nodes (default: as the store; 0 = off)")
    g.add_argument("--peer-latency-ms", type=number_in(0), default=None)
    g.add_argument("--offload-gbps", type=number_in(0), default=None,
                   help="device -> store GB/s (default: as the store)")
    g.add_argument("--noise", type=number_in(0), default=0.1,
                   help="sigma of a log-normal factor on every prefill and transfer")
    g.add_argument("--hide", type=number_in(0), default=HIDE,
                   help="share of a node's expected queue the cost model lets a load hide "
                   "behind (0 = a load must beat recompute on its own)")
    g.add_argument("--prior-scale", type=above_zero, default=1.0,
                   help="estimates start with times x this (then learn from observations)")
    a("--seeds", default="0", help="comma list of noise seeds; each cell is run once per seed "
      "and reported as the mean (min-max)")
    a("--hash-algo", choices=("sha256", "xxh3"), default="xxh3")
    a("--threads", type=positive, default=1, help="torch intra-op threads")
    a("--json", metavar="PATH", default=None)
    a("--plot", metavar="PREFIX", default=None,
      help="write PREFIX_cdf.png and PREFIX_attainment.png")
    return p


def _timing(args: argparse.Namespace, store_gbps: float) -> Timing:
    model = ModelShape(name=args.model_name, num_params=args.params, vocab_size=args.vocab,
                       hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                       num_kv_heads=args.kv_heads, head_dim=args.head_dim,
                       dtype_bytes=args.dtype_bytes)
    gpu = GpuSpec(name=args.gpu_name, peak_flops=args.peak_tflops * 1e12, memory_bytes=0)
    prefill = prefill_estimate(model, gpu, gemm_mfu=args.gemm_mfu, attn_mfu=args.attn_mfu,
                               overhead_s=args.pass_overhead_ms / 1e3)

    def path(gbps: float | None, latency_ms: float) -> TransferEstimate | None:
        return None if not gbps else TransferEstimate(bytes_per_s=gbps * 1e9,
                                                      latency_s=latency_ms / 1e3)

    store = path(store_gbps, args.store_latency_ms)
    peer_gbps = store_gbps if args.peer_gbps is None else args.peer_gbps
    peer_lat = args.store_latency_ms if args.peer_latency_ms is None else args.peer_latency_ms
    return Timing(prefill=prefill, bytes_per_token=model.kv_bytes_per_token, store=store,
                  peer=path(peer_gbps, peer_lat),
                  offload=path(args.offload_gbps, args.store_latency_ms), noise=args.noise)


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))  # NOTE: small index tensors; handoffs cost more
    try:
        device = parse_tokens(args.device_tokens)
        store_cap = parse_tokens(args.store_tokens)
        policies = policy_names([p.strip() for p in args.policies.split(",") if p.strip()])
    except ValueError as exc:
        parser.error(str(exc))
    ps = args.page_size
    if device is None or min(ps, args.block_size, args.nodes) <= 0 or args.slo_ttft <= 0:
        parser.error("--device-tokens must be finite; --page-size, --block-size, --nodes and "
                     "--slo-ttft must be positive")
    if not all(args.rate_scale):
        parser.error("--rate-scale values must be > 0")
    try:
        seeds = [int(v) for v in args.seeds.split(",") if v.strip()]
    except ValueError:
        parser.error(f"--seeds must be a comma list of ints, got {args.seeds!r}")
    if not seeds:
        parser.error("--seeds needs at least one seed")
    device = max(ps, device // ps * ps)
    if args.trace.startswith(PREFIX):
        try:
            requests = generated_requests(args.trace, args.block_size, args.limit)
        except ValueError as exc:
            parser.error(str(exc))
    else:
        requests = load_timed_trace(args.trace, args.block_size, args.limit)
    if len(requests) < 2:
        parser.error(f"{args.trace} holds fewer than 2 requests")
    start = time.perf_counter()
    hashes = request_hashes(requests, args.block_size, ps, args.hash_algo)
    span = requests[-1].arrival_s - requests[0].arrival_s
    first = _timing(args, args.store_gbps[0])
    print(f"cluster bench: {args.trace}: {len(requests):,} requests over {span:,.0f} s "
          f"({len(requests) / max(span, 1e-9):.2f} req/s), {args.nodes} nodes x "
          f"{device:,} device tokens, store {args.store_tokens} tokens; {args.model_name} "
          f"({first.bytes_per_token:,} KV B/token) on {args.gpu_name}; prefill "
          f"{first.prefill}; hashes in {time.perf_counter() - start:.1f}s", flush=True)
    rows: list[dict[str, Any]] = []
    per_seed: list[dict[str, Any]] = []
    ttfts: dict[tuple[str, float, str], np.ndarray] = {}
    for gbps in args.store_gbps:
        timing = _timing(args, gbps)
        tier = f"{gbps:g}GB/s" if gbps else "off"
        for scale in args.rate_scale:
            for policy in policies:
                loads = "cost" if policy == "radixlink" else args.baseline_loads
                cell, results = [], []
                for seed in seeds:
                    cfg = ClusterConfig(policy=policy, timing=timing, num_nodes=args.nodes,
                                        page_size=ps, block_size=args.block_size,
                                        device_tokens=device, store_tokens=store_cap,
                                        rate_scale=scale, node_loads=loads,
                                        prior_scale=args.prior_scale, seed=seed,
                                        hash_algo=args.hash_algo, hide=args.hide)
                    t0 = time.perf_counter()
                    res = simulate(requests, hashes, cfg)
                    row = summarize(res, slo_s=args.slo_ttft, tier=tier)
                    row.update(seed=seed, wall_s=time.perf_counter() - t0)
                    cell.append(row)
                    results.append(res.ttft_s)
                per_seed += cell
                row = aggregate(cell)
                rows.append(row)
                ttfts[(tier, scale, policy)] = np.concatenate(results)
                print(f"  store {tier} x{scale:g} {policy:13s} p99 {row['ttft_p99_s']:.3f} s, "
                      f"SLO {row['slo_attainment']:.4f} ({row['wall_s']:.1f} s)", flush=True)
    print_table(table_rows(rows), f"\nper store tier, rate and policy (SLO: TTFT <= "
                f"{args.slo_ttft:g} s; loads: what nodes load; mean over seeds {args.seeds})")
    print_table(verdicts(rows), "\nradixlink against the baselines (mean over seeds; store-only = "
                "requests whose prefix the store held beyond every device)")
    if args.json:
        write_json(args.json, {"bench": "cluster", "machine": machine_info(),
                               "trace": str(args.trace),
                               "config": {k: v for k, v in vars(args).items()
                                          if k not in ("json", "plot")},
                               "timing": repr(first), "results": rows,
                               "per_seed": per_seed})
    if args.plot:
        title = (f"{Path(args.trace).name}: {args.nodes} nodes, {args.model_name} on "
                 f"{args.gpu_name}")
        for path in plot(rows, ttfts, args.plot, title):
            print(f"wrote {path}", file=sys.stderr)
    return 0
