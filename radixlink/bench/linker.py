"""`radixlink bench linker`: the linker's data path against what it sits on, in one run.

- tree: the `bench tree` workload with a write-through linker attached (memory:// and
  file://), process CPU per request vs the plain tree (no linker, no hashing), pages
  offloaded per request; rotating rounds, medians.
- load: a SmolLM2-size prefix loaded through the linker vs a raw read of the same bytes into
  the same pool (memory:// and file://, warm page cache).
- ttft: the reference engine's store-hit requests, whole load then compute vs layer-wise.

Owns the command line and the summary; the parts live in ``linker_tree``, ``linker_load`` and
``linker_ttft``.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch

from radixlink.bench.common import add_common_args, machine_info, print_table, write_json
from radixlink.bench.linker_tree import Mode, compare
from radixlink.bench.workload import WorkloadSpec, make_workload
from radixlink.cmdargs import CommandParser, int_at_least

PARTS = ("tree", "load", "ttft")
BREAKDOWN = ("tree + KV pools", "tree + KV pools + page hashes")
STORES = {"memory": "memory://?capacity=4GiB", "file": "file://{dir}?capacity=4GiB"}


def _tree(args: argparse.Namespace) -> list[dict[str, Any]]:
    requests = make_workload(WorkloadSpec(num_requests=args.requests, seed=args.seed))
    rows = []
    for capacity in args.capacity:
        # NOTE: --breakdown adds what a linker-enabled cache costs before any linker work:
        # the KV pools (slot checks, pool bookkeeping), then the page hashes of every insert
        steps = [Mode(name=BREAKDOWN[0], kv="layout"), Mode(name=BREAKDOWN[1], kv="hashed")]
        modes = [Mode(name="plain"), *(steps if args.breakdown else []),
                 Mode(name="memory://", store=STORES["memory"])]
        memory = compare(requests, modes, capacity, args.page_size, args.head_dim,
                         args.rounds)
        rows += memory
        if args.file_requests:
            # NOTE: one file per page (a 32-byte page here): kernel file creation dominates,
            # so fewer requests and rounds keep the run short; per request it compares alike.
            few = requests[: args.file_requests]
            file_rows = compare(few, [Mode(name="plain"), Mode(name="file://",
                                                               store=STORES["file"])],
                                capacity, args.page_size, args.head_dim,
                                max(1, args.rounds // 2))
            rows += [dict(row, mode=f"{row['mode']} ({len(few)} req)") for row in file_rows]
    return rows


def _load(args: argparse.Namespace) -> list[dict[str, Any]]:
    from radixlink.bench.linker_load import measure

    return [measure(STORES[name], num_pages=args.load_pages, rounds=args.load_rounds)
            for name in ("memory", "file")]


def _ttft(args: argparse.Namespace) -> dict[str, Any] | None:
    from radixlink.bench.linker_ttft import measure

    try:
        return measure(args.model, STORES["memory"], prompts=args.ttft_prompts,
                       prompt_tokens=args.ttft_tokens, rounds=args.ttft_rounds)
    except ValueError as exc:  # NOTE: no weights here (a clone without the models extra)
        print(f"ttft part skipped: {exc}")
        return None


def summary(tree: list[dict[str, Any]], load: list[dict[str, Any]],
            ttft: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One row per headline figure: what, the linker's value, the baseline's, their ratio."""
    rows = []
    plain = {(r["capacity"], r["mode"].split(" (")[1] if " (" in r["mode"] else ""):
             r["cpu us/req"] for r in tree if r["mode"].startswith("plain")}
    for r in tree:
        if r["mode"].startswith("plain"):
            continue
        few = r["mode"].split(" (")[1] if " (" in r["mode"] else ""
        rows.append({"figure": f"CPU/request, capacity {r['capacity']:,}, {r['mode']}",
                     "linker": round(r["cpu us/req"], 1), "baseline": round(
                         plain[(r["capacity"], few)], 1), "unit": "us (plain tree)",
                     "ratio": round(r["vs plain"], 2)})
        if r["mode"] in BREAKDOWN:  # no linker: nothing offloaded
            continue
        rows.append({"figure": f"pages offloaded/request, capacity {r['capacity']:,}, "
                               f"{r['mode']}", "linker": round(r["pages offloaded/req"], 1),
                     "baseline": "", "unit": "pages", "ratio": ""})
    for r in load:
        rows.append({"figure": f"load {r['MB']:.1f} MB ({r['pages']} SmolLM2 pages), "
                               f"{r['store']}", "linker": round(r["linker GB/s"], 2),
                     "baseline": round(r["raw GB/s"], 2), "unit": "GB/s (raw read)",
                     "ratio": round(r["linker/raw"], 2)})
    if ttft is not None:
        whole, layerwise = ttft["rows"]
        rows.append({"figure": f"TTFT of store hits, {ttft['model']}, layer-wise vs whole",
                     "linker": round(layerwise["ttft ms (median)"], 1),
                     "baseline": round(whole["ttft ms (median)"], 1), "unit": "ms",
                     "ratio": round(layerwise["vs whole"], 3)})
    return rows


def _parts(text: str) -> list[str]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if not parts or unknown:
        raise argparse.ArgumentTypeError(f"parts must be a comma list of {', '.join(PARTS)}, "
                                         f"got {text!r}")
    return parts


def main(argv: list[str]) -> int:
    from radixlink.bench.tree import _positive_ints

    positive = int_at_least(1)
    parser = CommandParser(prog="radixlink bench linker", description=__doc__)
    parser.add_argument("--parts", type=_parts, default=",".join(PARTS))
    parser.add_argument("--requests", type=positive, default=2000)
    parser.add_argument("--file-requests", type=int_at_least(0), default=300,
                        help="requests of the file:// tree rows (0: none)")
    parser.add_argument("--capacity", type=_positive_ints, default="262144,32768")
    parser.add_argument("--page-size", type=positive, default=16)
    parser.add_argument("--head-dim", type=positive, default=1,
                        help="tree part: bytes per token and K or V (1 layer, 1 head, uint8)")
    parser.add_argument("--rounds", type=positive, default=5, help="tree part: rounds")
    parser.add_argument("--breakdown", action="store_true",
                        help="tree part: also the tree with the linker's KV pools, and with "
                             "pools and page hashes, without a linker")
    parser.add_argument("--load-pages", type=positive, default=70)
    parser.add_argument("--load-rounds", type=positive, default=9)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--ttft-prompts", type=positive, default=4)
    parser.add_argument("--ttft-tokens", type=positive, default=1024)
    parser.add_argument("--ttft-rounds", type=positive, default=3)
    parser.add_argument("--seed", type=int, default=0)
    add_common_args(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"bench linker: parts {','.join(args.parts)}; tree: {args.requests} requests (file: "
          f"{args.file_requests}), page {args.page_size}, capacities {args.capacity}, "
          f"{args.rounds} rotating rounds, write_through; load: {args.load_pages} pages x "
          f"{args.load_rounds} rounds; ttft: {args.model}, {args.ttft_prompts} prompts of "
          f"{args.ttft_tokens} tokens x {args.ttft_rounds} rounds")
    tree = _tree(args) if "tree" in args.parts else []
    load = _load(args) if "load" in args.parts else []
    ttft = _ttft(args) if "ttft" in args.parts else None
    if tree:
        print_table([{k: v for k, v in r.items() if k != "cpu s (rounds)"} for r in tree],
                    "tree workload: process CPU per request (median of rounds)")
    if load:
        print_table([{k: v for k, v in r.items() if k != "rounds"} for r in load],
                    "load of a SmolLM2-size prefix vs a raw read into the pool (medians)")
    if ttft is not None:
        print_table(ttft["rows"], f"TTFT of store-hit requests ({ttft['model']}, "
                    f"{ttft['store']})")
    rows = summary(tree, load, ttft)
    print_table(rows, "summary")
    if args.json:
        write_json(args.json, {"bench": "linker", "machine": machine_info(),
                               "args": {k: v for k, v in vars(args).items() if k != "json"},
                               "rows": rows, "tree": tree, "load": load,
                               "ttft": None if ttft is None else {
                                   k: v for k, v in ttft.items() if k != "runs"},
                               "cpu_spread": [statistics.pstdev(r["cpu s (rounds)"])
                                              for r in tree]})
    return 0
