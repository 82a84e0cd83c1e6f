"""`radixlink demo` end to end on a tiny config: node processes, tables, the identity check."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest

from radixlink.bench import e2e
from radixlink.engine.demo import _check_store, faults_url, main, percentile


def test_demo_main_prints_identical_line(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo on tiny-hybrid with faults runs both phases and reports N/N identical outputs."""
    code = main(["--model", "tiny-hybrid", "--conversations", "2", "--turns", "2",
                 "--max-new-tokens", "3", "--context-tokens", "120",
                 "--faults", "fail=0.2,corrupt=0.05,delay_ms=1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "node 0" in out and "node 1" in out and "TTFT p50 s" in out
    assert out.rstrip().splitlines()[-1] == "outputs identical to cache-off run: 4/4 requests"


@pytest.mark.parametrize("args", [["--store", "memory://"],
                                  ["--store", "memory://?capacity=64MiB", "--faults", "fail=0.1"],
                                  ["--engine", "vllm", "--store", "memory://"]])
def test_demo_refuses_a_store_its_node_processes_cannot_share(args: list[str]) -> None:
    """memory:// lives in one process and each node is a process: the demo says so before it
    starts a node, instead of running with no node ever reading another's pages."""
    with pytest.raises(ValueError, match=r"one process's memory.*file:///path/to/dir"):
        main(["--model", "tiny-hybrid", *args] if "--engine" not in args else args)


def test_demo_store_check_accepts_a_tiered_store_with_a_shared_back(tmp_path: Path) -> None:
    """A private memory:// front is fine when the back is a store the processes share."""
    front, back = quote("memory://", safe=""), quote(f"file://{tmp_path}", safe="")
    _check_store(f"tiered://?front={front}&back={back}")


def test_faults_url_and_percentile() -> None:
    """--faults becomes a faults:// URL around the encoded inner URL; bad knobs are refused."""
    url = faults_url("file:///tmp/x?capacity=1GiB", "fail=0.2,delay_ms=20", seed=3)
    assert url == ("faults://?inner=file%3A%2F%2F%2Ftmp%2Fx%3Fcapacity%3D1GiB&seed=3"
                   "&fail=0.2&delay_ms=20.0")
    with pytest.raises(ValueError, match="unknown fault"):
        faults_url("memory://", "explode=1", seed=0)
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0 and percentile([], 99) == 0.0


def test_bench_e2e_writes_json_and_plot(tmp_path: Path) -> None:
    """bench e2e runs cache off, device only and device + store side by side, with identical
    outputs, and writes its JSON and TTFT CDF plot."""
    out, png = tmp_path / "e2e.json", tmp_path / "e2e.png"
    code = e2e.main(["--model", "tiny-hybrid", "--nodes", "1", "--conversations", "2",
                     "--turns", "2", "--max-new-tokens", "2", "--context-tokens", "100",
                     "--threads", "1",
                     "--json", str(out), "--plot", str(png)])
    assert code == 0
    results = json.loads(out.read_text())["results"]
    assert [r["mode"] for r in results] == ["off", "device", "store"]
    assert all(r["identical"] == "4/4" for r in results)
    assert results[1]["prefill_tokens"] < results[0]["prefill_tokens"]
    assert png.stat().st_size > 0
