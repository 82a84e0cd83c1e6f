"""`radixlink bench all [--quick]`: every benchmark at a size that finishes in minutes; writes
``bench/results/`` (each bench's JSON, the PNGs) and ``results.md`` (machine, date, commands,
one table per bench), optionally into README.md between the benchmark markers.

Owns the list of runs and the summary. Benchmarks are called through their ``main(argv)``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import os
import shlex
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixlink.bench.common import machine_info

DEFAULT_TRACE = "../shared/traces/conversation_trace.jsonl"
README_BEGIN, README_END = "<!-- bench-all:begin -->", "<!-- bench-all:end -->"


@dataclass(slots=True)
class Run:
    """One benchmark invocation and what it produced."""

    name: str
    module: str
    argv: list[str]
    json_path: Path
    note: str = ""
    seconds: float = 0.0
    error: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def command(self) -> str:
        bench = self.module.rsplit(".", 1)[1]
        return shlex.join(["radixlink", "bench", bench, *self.argv])


def plan(out: Path, quick: bool, trace: Path | None, store_dir: Path) -> list[Run]:
    """The runs, sized by ``quick``; ``trace`` None = a synthetic trace written to ``out``."""
    def j(name: str) -> Path:
        return out / f"{name}.json"

    q = quick
    runs = [
        Run("memory", "radixlink.bench.memory",
            ["--mib", "16" if q else "64", "--repeat", "3" if q else "5", "--page-sizes", "16",
             "64", "--json", str(j("memory"))], j("memory")),
        Run("hash", "radixlink.bench.hash",
            ["--num-tokens", "16384" if q else "65536", "--rounds", "10" if q else "30",
             "--json", str(j("hash"))], j("hash")),
        Run("tree", "radixlink.bench.tree",
            ["--requests", "500" if q else "2000", "--reps", "1" if q else "3",
             "--page-size", "16", "--capacity", "65536,2097152", "--json", str(j("tree"))],
            j("tree")),
    ]
    for kind, url in (("memory", "memory://?capacity=1GiB"),
                      ("file", f"file://{store_dir}?capacity=1GiB")):
        runs.append(Run(f"store-{kind}", "radixlink.bench.store",
                        ["--store", url, "--total", "8MiB" if q else "32MiB", "--repeat",
                         "3", "--json", str(j(f"store-{kind}"))], j(f"store-{kind}"),
                        note="file store in a temporary folder" if kind == "file" else ""))
    size = ["--requests", "500", "--rounds", "2", "--file-requests", "100", "--load-rounds", "3",
            "--ttft-prompts", "2", "--ttft-rounds", "1"] if q else []
    runs.append(Run("linker", "radixlink.bench.linker", [*size, "--json", str(j("linker"))],
                    j("linker")))
    note = ""
    if trace is None:
        trace = out / "synthetic_trace.jsonl"
        note = "the conversation trace was not found: a synthetic trace was used"
    trace_argv = ["--trace", str(trace), "--page-size", "512", "--nodes", "4",
                  "--capacity", "256K,1M,inf", "--mode", "both", "--json", str(j("trace")),
                  "--plot", str(out / "trace.png")]
    if q:
        trace_argv += ["--limit", "3000"]
    runs.append(Run("trace", "radixlink.bench.trace", trace_argv, j("trace"), note=note))
    # NOTE: the synthetic trace (100 req/s of short prompts) needs slower rates than the real one
    scales = "3,4,5" if not note else "0.5,1,1.5"
    runs.append(Run("cluster", "radixlink.bench.cluster",
                    ["--trace", str(trace), "--limit", "1500" if q else "3000", "--rate-scale",
                     scales, "--json", str(j("cluster")), "--plot", str(out / "cluster")],
                    j("cluster"), note=note))
    if importlib.util.find_spec("radixlink.bench.e2e") is not None:
        size = ["--conversations", "2", "--turns", "2"] if q else []
        runs.append(Run("e2e", "radixlink.bench.e2e", [*size, "--json", str(j("e2e")),
                                                       "--plot", str(out / "e2e_ttft.png")],
                        j("e2e")))
    return runs


def execute(run: Run) -> None:
    """Call the bench's ``main(argv)``; a failure is recorded, never raised."""
    start = time.perf_counter()
    try:
        code = importlib.import_module(run.module).main(list(run.argv))
        if code:
            run.error = f"exit status {code}"
    except SystemExit as exc:  # argparse errors
        run.error = f"exit status {exc.code}"
    except Exception:  # noqa: BLE001 - one broken bench must not stop the others
        run.error = traceback.format_exc(limit=3)
    run.seconds = time.perf_counter() - start
    if run.json_path.is_file():
        run.data = json.loads(run.json_path.read_text())


def _md(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return ["(no rows)"]
    cols = list(rows[0])

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
        return "inf" if v is None else str(v)

    return [f"| {' | '.join(cols)} |", f"|{'---|' * len(cols)}",
            *(f"| {' | '.join(cell(r.get(c)) for c in cols)} |" for r in rows)]


def _pick(rows: list[dict[str, Any]], cols: dict[str, str]) -> list[dict[str, Any]]:
    return [{label: row.get(key) for key, label in cols.items()} for row in rows]


def _tree(d: dict[str, Any]) -> list[dict[str, Any]]:
    return _pick([r["row"] for r in d.get("results", [])],
                 {"page": "page", "capacity": "capacity tokens", "req/s": "req/s (median)",
                  "hit": "hit ratio", "match us": "match us", "insert us": "insert us"})


def _trace(d: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [dict(r, device=r["device_hit_ratio"], store=r["store_hit_ratio"],
                 load_gb=r["load_bytes"] / 1e9) for r in d.get("results", [])]
    return _pick(rows, {"nodes": "nodes", "capacity_tokens": "device tokens/node", "mode": "mode",
                        "hit_ratio": "hit ratio", "device": "from device", "store": "from store",
                        "upper_bound": "trace bound", "load_gb": "GB loaded (ref. model)",
                        "wall_s": "replay s", "requests_per_s": "req/s"})


def _generic(d: dict[str, Any]) -> list[dict[str, Any]]:
    rows = d.get("rows") or d.get("results") or []
    return [{k: v for k, v in r.items() if isinstance(v, (int, float, str))} for r in rows
            if isinstance(r, dict)]


SUMMARIES: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]]] = {
    "tree": _tree, "trace": _trace,
    "cluster": lambda d: _pick(d.get("results", []), {k: k for k in (
        "rate_scale", "req_per_s", "policy", "ttft_p50_s", "ttft_p99_s", "slo_attainment",
        "goodput_rps", "prefill_saved", "store_only_p99_s")}),
    "memory": lambda d: _pick(d.get("rows", []), {k: k for k in (
        "page_size", "gather_GBps", "copy_out_GBps", "gather_ratio", "scatter_GBps",
        "copy_in_GBps", "scatter_ratio")}),
    "hash": lambda d: _pick(d.get("rows", []), {k: k for k in (
        "page_size", "impl", "input", "pages_per_s", "us_per_page", "ratio_vs_raw_sha256")}),
}


def report(runs: list[Run], quick: bool, started: datetime.datetime, wall: float) -> str:
    """results.md: date, machine, then per bench its command, run time and summary table."""
    info = machine_info()
    info["cpu"] = _cpu_model()
    info["cpus"] = str(os.cpu_count())
    if hasattr(os, "getloadavg"):
        info["load average at the end"] = f"{os.getloadavg()[0]:.1f}"
    lines = [
        f"Generated by `radixlink bench all{' --quick' if quick else ''}` on "
        f"{started:%Y-%m-%d %H:%M} UTC in {wall:.0f} s. Machine: "
        + ", ".join(f"{k} {v}" for k, v in info.items()) + ".", "",
    ]
    for run in runs:
        lines += [f"### {run.name}", "", f"`{run.command}` ({run.seconds:.0f} s)", ""]
        if run.note:
            lines += [f"Note: {run.note}.", ""]
        if run.error:
            lines += ["Failed: " + run.error.strip().splitlines()[-1], ""]
            continue
        summary = SUMMARIES.get(run.name.split("-")[0], _generic)
        lines += [*_md(summary(run.data)), ""]
        for png, title in (("trace", "hit ratio vs capacity"), ("e2e", "TTFT CDFs")):
            image = run.json_path.with_name("trace.png" if png == "trace" else "e2e_ttft.png")
            if run.name == png and image.is_file():
                lines += [f"![{title}]({image.name})", ""]
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def update_readme(readme: Path, text: str) -> None:
    """Replace what lies between the bench-all markers of ``readme`` with ``text``.

    Raises:
        ValueError: the markers are missing.
    """
    body = readme.read_text()
    if README_BEGIN not in body or README_END not in body:
        raise ValueError(f"{readme} lacks the {README_BEGIN} / {README_END} markers")
    head, rest = body.split(README_BEGIN, 1)
    tail = rest.split(README_END, 1)[1]
    readme.write_text(f"{head}{README_BEGIN}\n{text}\n{README_END}{tail}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="radixlink bench all", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (about a minute)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--trace", type=Path, default=Path(DEFAULT_TRACE),
                        help="Mooncake trace (a synthetic one is used when missing)")
    parser.add_argument("--readme", type=Path, default=None,
                        help="also put the summary into this README between the markers")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    store_dir = Path(tempfile.mkdtemp(prefix="radixlink-bench-"))
    trace = args.trace if args.trace.is_file() else None
    runs = plan(args.out, args.quick, trace, store_dir)
    if trace is None:
        from radixlink.bench.trace import synthetic_trace

        with open(args.out / "synthetic_trace.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in synthetic_trace(3000, seed=0))
    start = time.perf_counter()
    try:
        for run in runs:
            print(f"\n=== {run.command}", flush=True)
            execute(run)
            print(f"=== {run.name}: {run.seconds:.1f} s{' FAILED' if run.error else ''}")
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)
    text = report(runs, args.quick, started, time.perf_counter() - start)
    (args.out / "results.md").write_text("# radixlink benchmark results\n\n" + text + "\n")
    print(f"\nwrote {args.out / 'results.md'}")
    if args.readme is not None:
        for image in ("trace.png", "e2e_ttft.png"):
            text = text.replace(f"]({image})", f"]({args.out}/{image})")
        update_readme(args.readme, text)
        print(f"updated {args.readme}")
    failed = [r.name for r in runs if r.error]
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0
