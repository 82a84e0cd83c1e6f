"""Generated Mooncake-format traces (`bench cluster --trace gen:...`): one spec gives one
trace, the reuse knob sets how many blocks repeat (and only as shared prefixes of full blocks),
the burst knob sets the spread of the gaps between arrivals, and a bad spec is a ValueError
naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from radixlink.bench.cluster import main
from radixlink.bench.cluster_gen import TraceSpec, generate, generated_requests
from radixlink.bench.cluster_trace import TimedRequest, parse_timed_trace
from radixlink.bench.trace import synthetic_trace

BS = 64


def repeated_share(reqs: list[TimedRequest]) -> float:
    """The share of full blocks whose id an earlier request already had."""
    seen: set[int] = set()
    repeated = total = 0
    for r in reqs:
        full = r.hash_ids[: r.input_len // BS]
        repeated += sum(b in seen for b in full)
        total += len(full)
        seen.update(full)
    return repeated / total


def test_one_spec_gives_one_trace() -> None:
    a = generated_requests("gen:requests=300,seed=5", BS)
    assert a == generated_requests("gen:requests=300,seed=5", BS)
    assert a != generated_requests("gen:requests=300,seed=6", BS)
    assert len(a) == 300 and a[0].arrival_s == 0.0
    assert len(generated_requests("gen:requests=300", BS, limit=40)) == 40


def assert_blocks_repeat_only_as_full_block_prefixes(reqs: list[TimedRequest]) -> None:
    """A repeated block is always part of a prefix of blocks some earlier request had in the
    same positions, and the id of a partly filled last block is never seen again (its content
    changes when the turn goes on: the reply fills it)."""
    where: dict[int, tuple[int, tuple[int, ...]]] = {}  # id -> (position, blocks before it)
    partial: set[int] = set()
    for r in reqs:
        assert not partial & set(r.hash_ids), "a partial block's id came back"
        full = r.hash_ids[: r.input_len // BS]
        for pos, b in enumerate(full):
            if b in where:
                assert where[b] == (pos, full[:pos])
            where.setdefault(b, (pos, full[:pos]))
        if r.input_len % BS:
            partial.add(r.hash_ids[-1])


def test_reuse_sets_how_much_repeats_and_only_as_full_block_prefixes() -> None:
    """No block repeats at reuse 0; most do at 0.9, as prefixes of full blocks."""
    none = generated_requests("gen:requests=800,reuse=0,seed=1", BS)
    most = generated_requests("gen:requests=800,reuse=0.9,seed=1", BS)
    assert repeated_share(none) == 0.0
    assert repeated_share(most) > 0.5
    assert_blocks_repeat_only_as_full_block_prefixes(most)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_fixture_trace_reuses_only_full_blocks_too(seed: int) -> None:
    """`bench.trace.synthetic_trace` (the tests' and `bench all`'s small chat trace) keeps the
    same rule: a turn reuses its previous prompt's full blocks, never its partial last one."""
    lines = [json.dumps(r) for r in synthetic_trace(400, block_size=BS, seed=seed)]
    reqs = parse_timed_trace(lines, BS)
    assert repeated_share(reqs) > 0.3
    assert_blocks_repeat_only_as_full_block_prefixes(reqs)


@pytest.mark.parametrize("burst", [1.0, 4.0])
def test_burst_sets_the_spread_of_arrival_gaps(burst: float) -> None:
    """Gamma gaps: mean 1 / rate, coefficient of variation ``burst`` (sampled: +-20%)."""
    reqs = generated_requests(f"gen:requests=6000,rate=5,burst={burst},seed=2", BS)
    gaps = np.diff([r.arrival_s for r in reqs])
    assert gaps.mean() == pytest.approx(0.2, rel=0.2)
    assert gaps.std() / gaps.mean() == pytest.approx(burst, rel=0.2)


def test_records_are_mooncake_format() -> None:
    rec = next(generate(TraceSpec(requests=2), BS))
    assert set(rec) == {"timestamp", "input_length", "output_length", "hash_ids"}
    assert 0 < rec["input_length"] <= len(rec["hash_ids"]) * BS
    json.dumps(rec)


@pytest.mark.parametrize(("spec", "named"), [
    ("gen:reuse=1.5", "reuse=1.5"),
    ("gen:burst=0", "burst=0"),
    ("gen:requests=1", "requests=1"),
    ("gen:rate=inf", "rate=inf"),
    ("gen:colour=3", "colour=3"),
    ("gen:seed=x", "seed='x'"),
    ("gen:reuse", "reuse"),
    ("reuse=0.5", "gen:"),
])
def test_a_bad_spec_names_the_value(spec: str, named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("+", r"\+")):
        TraceSpec.parse(spec)


def test_bench_cluster_runs_a_generated_trace(tmp_path: Path) -> None:
    """The spec is the trace argument; a bad one is a usage error naming it."""
    out = tmp_path / "gen.json"
    code = main(["--trace", "gen:requests=80,rate=20,prompt=2000,seed=3", "--block-size",
                 str(BS), "--page-size", str(BS), "--nodes", "2", "--device-tokens", "8K",
                 "--rate-scale", "1", "--policies", "device_prefix,radixlink",
                 "--json", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["trace"].startswith("gen:") and len(doc["results"]) == 2
    assert all(r["requests"] == 80 for r in doc["results"])
    with pytest.raises(ValueError, match="reuse=2"):
        main(["--trace", "gen:reuse=2", "--policies", "radixlink"])
