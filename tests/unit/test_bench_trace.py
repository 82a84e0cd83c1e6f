"""`radixlink bench trace` on small generated Mooncake-format traces: the replay through the real
tree reaches the trace's own bound, shared stores add store hits, and the CLI writes its files."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np
import pytest

from radixlink.bench.trace import (
    BlockTokens,
    TraceRequest,
    main,
    parse_trace,
    route_requests,
    synthetic_trace,
    upper_bound_hit_tokens,
)
from radixlink.bench.trace_replay import ReplayConfig, replay
from radixlink.cmdargs import UsageError

BS = 32


def generated(num_requests: int = 150, seed: int = 0, block_size: int = BS) -> list[TraceRequest]:
    lines = [json.dumps(r) for r in synthetic_trace(num_requests, block_size=block_size,
                                                    seed=seed)]
    return parse_trace(lines, block_size)


def run(requests: list[TraceRequest], **kw: object) -> dict[str, object]:
    cfg = ReplayConfig(**{"page_size": BS, "capacity": None, **kw})  # type: ignore[arg-type]
    routes = route_requests(requests, cfg.nodes, cfg.route)
    return replay(requests, routes, BlockTokens(BS, seed=1), cfg)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mode", ["local", "shared"])
def test_unbounded_single_node_hits_exactly_the_trace_bound(seed: int, mode: str) -> None:
    """page = block, one node, capacity inf: hit tokens == the leading-seen-full-blocks bound."""
    requests = generated(seed=seed)
    bound = upper_bound_hit_tokens(requests, BS)
    row = run(requests, mode=mode)
    assert bound > 0
    assert row["device_hit_tokens"] == bound and row["store_hit_tokens"] == 0
    assert row["input_tokens"] == sum(r.input_len for r in requests)
    assert round(row["hit_ratio"], 4) == round(bound / row["input_tokens"], 4)


def test_smaller_pages_reuse_at_least_the_bound() -> None:
    """Pages smaller than blocks also reuse whole pages of partial blocks: hits >= the bound."""
    requests = generated(seed=3)
    row = run(requests, page_size=8)
    assert row["device_hit_tokens"] >= upper_bound_hit_tokens(requests, BS)


def test_shared_store_recovers_what_local_caches_miss() -> None:
    """Two small round-robin nodes: local misses prefixes the other node computed; shared mode
    gets them from the store, never below local, with exact accounting (checked in replay)."""
    requests = generated(200, seed=4)
    local = run(requests, capacity=64 * BS, nodes=2, mode="local")
    shared = run(requests, capacity=64 * BS, nodes=2, mode="shared")
    assert shared["store_hit_tokens"] > 0 and local["store_hit_tokens"] == 0
    assert shared["hit_ratio"] > local["hit_ratio"]
    assert shared["device_hit_tokens"] >= local["device_hit_tokens"]
    assert shared["load_bytes"] == shared["store_hit_tokens"] * 131072
    assert shared["hit_ratio"] <= 1.0


def test_bounded_store_evicts_and_hits_no_more_than_unbounded() -> None:
    """A store of a few pages evicts (LRU) and yields at most the unbounded store's hits."""
    requests = generated(200, seed=5)
    small = run(requests, capacity=64 * BS, nodes=2, mode="shared", store_capacity=16 * BS)
    big = run(requests, capacity=64 * BS, nodes=2, mode="shared")
    assert small["store_evicted_pages"] > 0
    assert small["store_hit_tokens"] <= big["store_hit_tokens"]


def test_block_tokens_equal_ids_equal_tokens() -> None:
    """Equal ids give equal blocks, different ids different first tokens; prompts are cut to
    input_len and deterministic across instances."""
    a, b = BlockTokens(BS), BlockTokens(BS)
    p = a.prompt(TraceRequest(70, (5, 9, 5)))
    assert p.dtype == np.uint32 and len(p) == 70
    assert np.array_equal(p[2 * BS :], p[: 70 - 2 * BS])  # id 5 again, cut to 6 tokens
    assert np.array_equal(p, b.prompt(TraceRequest(70, (5, 9, 5))))
    assert p[0] != p[BS]


def test_routes_are_deterministic() -> None:
    """Round-robin cycles; hash routing keeps requests with the same opening on one node."""
    reqs = [TraceRequest(10, (0, 1, 2)), TraceRequest(10, (0, 1, 7)), TraceRequest(10, (0, 3))]
    assert route_requests(reqs, 2, "round-robin") == [0, 1, 0]
    hashed = route_requests(reqs, 4, "hash")
    assert hashed[0] == hashed[1] and hashed == route_requests(reqs, 4, "hash")
    with pytest.raises(ValueError, match="route"):
        route_requests(reqs, 2, "random")


def test_prompt_longer_than_its_blocks_is_rejected() -> None:
    """A line whose input_length exceeds its blocks names the line and --block-size."""
    line = json.dumps({"timestamp": 0, "input_length": 100, "output_length": 1,
                       "hash_ids": [1, 2]})
    with pytest.raises(ValueError, match="line 1.*block-size"):
        parse_trace([line], 32)
    with pytest.raises(ValueError, match="not a Mooncake record"):
        parse_trace(['{"input_length": 3}'], 32)


def test_cli_writes_json_and_plot(tmp_path: Path) -> None:
    """The CLI replays every (capacity, mode) pair and writes the JSON rows and a PNG."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in synthetic_trace(60, block_size=64)))
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    argv = ["--trace", str(trace), "--block-size", "64", "--page-size", "16", "--capacity",
            "1K", "--capacity", "inf", "--mode", "both", "--nodes", "2", "--no-progress",
            "--json", str(out), "--plot", str(png)]
    assert main(argv) == 0
    results = json.loads(out.read_text())["results"]
    assert [(r["capacity_tokens"], r["mode"]) for r in results] == [
        (1024, "local"), (1024, "shared"), (None, "local"), (None, "shared")]
    keys = {"capacity_tokens", "nodes", "mode", "page_size", "hit_ratio", "device_hit_tokens",
            "store_hit_tokens", "input_tokens", "wall_s", "requests_per_s", "load_bytes"}
    assert all(keys <= r.keys() and r["nodes"] == 2 for r in results)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_all_report_goes_between_the_readme_markers(tmp_path: Path) -> None:
    """`bench all` renders each run's command and summary table, and rewrites only what lies
    between the README markers (a missing marker is an error)."""
    from radixlink.bench.all import README_BEGIN, README_END, Run, report, update_readme

    run = Run("trace", "radixlink.bench.trace", ["--trace", "t.jsonl"], tmp_path / "trace.json")
    run.data = {"results": [{"nodes": 1, "capacity_tokens": None, "mode": "local",
                             "hit_ratio": 0.5, "device_hit_ratio": 0.5, "store_hit_ratio": 0.0,
                             "upper_bound": 0.5, "load_bytes": 0, "wall_s": 1.0,
                             "requests_per_s": 10.0}]}
    broken = Run("hash", "radixlink.bench.hash", [], tmp_path / "hash.json", error="boom")
    text = report([run, broken], False, datetime.datetime(2025, 1, 2), 3.0)
    assert "`radixlink bench trace --trace t.jsonl`" in text and "| 1 | inf | local |" in text
    assert "Failed: boom" in text
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{README_BEGIN}\nold\n{README_END}\ntail\n")
    update_readme(readme, text)
    body = readme.read_text()
    assert body.startswith("# x\n") and body.endswith(f"{README_END}\ntail\n")
    assert "old" not in body and "2025-01-02" in body
    readme.write_text("no markers")
    with pytest.raises(ValueError, match="markers"):
        update_readme(readme, text)


def test_cli_rejects_bad_sizes(tmp_path: Path) -> None:
    """Malformed capacities and non-positive sizes are one-line usage errors, not
    tracebacks (``UsageError``: the CLI prints it as one line and exits 2)."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in synthetic_trace(3, block_size=64)))
    for bad in (["--capacity", "lots"], ["--nodes", "0"], ["--store-capacity", "-5"]):
        with pytest.raises(UsageError):
            main(["--trace", str(trace), "--block-size", "64", "--no-progress", *bad])
