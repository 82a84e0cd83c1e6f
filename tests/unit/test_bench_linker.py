"""``radixlink bench linker`` runs end to end on a tiny workload: the tree rows compare a
linker-attached tree with the plain one, the load rows a linker load with a raw read, and the
summary carries one ratio per figure."""

from __future__ import annotations

import json
from pathlib import Path

from radixlink.bench.linker import main


def test_bench_linker_smoke(tmp_path: Path) -> None:
    """Tree (memory:// and file://) and load (memory:// and file://) parts on a few requests
    and pages: every linker row has a plain baseline, pages offloaded, and load ratios."""
    out = tmp_path / "linker.json"
    argv = ["--parts", "tree,load", "--requests", "60", "--file-requests", "20", "--rounds",
            "1", "--capacity", "8192", "--load-pages", "4", "--load-rounds", "1",
            "--json", str(out)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    modes = [row["mode"] for row in data["tree"]]
    assert modes == ["plain", "memory://", "plain (20 req)", "file:// (20 req)"]
    linked = [row for row in data["tree"] if not row["mode"].startswith("plain")]
    assert all(row["pages offloaded/req"] > 0 and row["cpu us/req"] > 0 for row in linked)
    assert [row["store"] for row in data["load"]] == ["memory://", "file://"]
    assert all(row["linker GB/s"] > 0 and row["linker/raw"] > 0 for row in data["load"])
    figures = [row["figure"] for row in data["rows"]]
    assert sum(f.startswith("CPU/request") for f in figures) == 2
    assert sum(f.startswith("load ") for f in figures) == 2


def test_bench_linker_breakdown_rows(tmp_path: Path) -> None:
    """--breakdown adds, per capacity, the tree with the linker's KV pools and with pools and
    page hashes (no linker: nothing offloaded) between the plain tree and the linker row."""
    out = tmp_path / "linker.json"
    argv = ["--parts", "tree", "--requests", "40", "--file-requests", "0", "--rounds", "1",
            "--capacity", "8192", "--breakdown", "--json", str(out)]
    assert main(argv) == 0
    tree = json.loads(out.read_text())["tree"]
    assert [row["mode"] for row in tree] == [
        "plain", "tree + KV pools", "tree + KV pools + page hashes", "memory://"]
    assert [row["pages offloaded/req"] > 0 for row in tree] == [False, False, False, True]
    figures = [row["figure"] for row in json.loads(out.read_text())["rows"]]
    assert sum(f.startswith("CPU/request") for f in figures) == 3
    assert sum(f.startswith("pages offloaded") for f in figures) == 1
