"""`radixlink bench peers`: the tree benchmark beside SGLang's prefix caches, run in turns.

Owns only the side-by-side driver. SGLang runs in its own venv through the peers' script (see
``--peers-dir``); nothing of SGLang is imported here. Skips cleanly when the venv is missing.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from radixlink.bench.common import add_common_args, machine_info, print_table, write_json
from radixlink.bench.tree import run_once
from radixlink.bench.workload import WorkloadSpec, make_workload
from radixlink.cmdargs import CommandParser, int_at_least

_LINE = re.compile(
    r"^\s*(?P<impl>[\w-]+)\s+(?P<backend>\S*)\s*page\s+(?P<page>\d+)\s+cap\s+(?P<cap>\d+):"
    r"\s+(?P<rps>[\d.]+) req/s.*hit (?P<hit>[\d.]+)"
)
_DEFAULT_PEERS = Path(__file__).resolve().parents[2].parent / "shared" / "tools" / "peers"


def _sglang(python: Path, script: Path, impl: str, ps: int, cap: int, n: int) -> dict[str, Any]:
    out = subprocess.run(
        [
            str(python),
            str(script),
            "--impl",
            impl,
            "--page-size",
            str(ps),
            "--capacity",
            str(cap),
            "--requests",
            str(n),
            "--reps",
            "1",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    ).stdout
    for line in out.splitlines():
        found = _LINE.match(line)
        if found:
            return {"req_s": float(found["rps"]), "hit_rate": float(found["hit"])}
    raise RuntimeError(f"no result line in the output of {script.name} --impl {impl}:\n{out}")


def main(argv: list[str]) -> int:
    positive = int_at_least(1)
    parser = CommandParser(prog="radixlink bench peers", description=__doc__)
    parser.add_argument(
        "--peers-dir",
        type=Path,
        default=_DEFAULT_PEERS,
        help="folder holding sglang_radix_bench.py (the peers' tool)",
    )
    parser.add_argument(
        "--venv",
        type=Path,
        default=Path(os.path.expanduser("~/.cache/peers/venv")),
        help="venv with SGLang (made by the peers' setup_peer_venvs.sh)",
    )
    parser.add_argument("--impl", default="radix,unified-py,unified-rust")
    parser.add_argument("--page-size", type=positive, default=16)
    parser.add_argument("--capacity", type=positive, default=262144)
    parser.add_argument("--requests", type=positive, default=2000)
    parser.add_argument("--rounds", type=positive, default=3, help="turns of every implementation")
    add_common_args(parser)
    args = parser.parse_args(argv)
    script = args.peers_dir / "sglang_radix_bench.py"
    python = args.venv / "bin" / "python"
    if not script.is_file() or not python.is_file():
        print(
            f"bench peers: skipped, needs {script} and {python} "
            "(run the peers' setup_peer_venvs.sh ... sglang)",
            file=sys.stderr,
        )
        return 0
    torch.set_num_threads(1)
    requests = make_workload(WorkloadSpec(num_requests=args.requests))
    run_once(requests[:200], args.page_size, args.capacity)
    impls = args.impl.split(",")
    results: dict[str, list[dict[str, Any]]] = {"radixlink": [], **{i: [] for i in impls}}
    for _ in range(args.rounds):  # NOTE: turns, so load changes hit every implementation alike
        ours = run_once(requests, args.page_size, args.capacity)
        results["radixlink"].append(
            {"req_s": len(requests) / ours["wall_s"], "hit_rate": ours["hit_rate"]}
        )
        for impl in impls:
            results[impl].append(
                _sglang(python, script, impl, args.page_size, args.capacity, args.requests)
            )
    ours_rps = statistics.median(r["req_s"] for r in results["radixlink"])
    rows = []
    for name, runs in results.items():
        rps = statistics.median(r["req_s"] for r in runs)
        rows.append(
            {
                "cache": name,
                "req/s (median)": rps,
                "runs": len(runs),
                "hit": round(runs[0]["hit_rate"], 3),
                "radixlink x": ours_rps / rps,
            }
        )
    print_table(
        rows,
        f"page {args.page_size}, capacity {args.capacity}, {args.requests} requests,"
        f" {args.rounds} rounds in turns",
    )
    if args.json:
        write_json(
            args.json,
            {"bench": "peers", "machine": machine_info(), "args": vars(args), "results": results},
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
