"""`radixlink demo --route POLICY`: a router process in front of the node processes, fed the
nodes' real KV events, places follow-up turns; outputs stay identical to cache off."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixlink.engine.demo import main
from radixlink.engine.nodes import NodePool, NodeSettings
from radixlink.engine.workload import WorkloadSpec
from radixlink.routing.process import RouterProcess, routed_summary

TINY = ["--model", "tiny-hybrid", "--conversations", "2", "--turns", "2",
        "--max-new-tokens", "3", "--context-tokens", "120"]


@pytest.mark.parametrize("policy", ["radixlink", "round_robin"])
def test_demo_routes_through_a_router_process(policy: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Both policies run end to end: the routed summary and the router's counters print, and
    every output equals the cache-off run."""
    assert main([*TINY, "--route", policy]) == 0
    out = capsys.readouterr().out
    assert f"routed by a {policy} router process" in out
    assert f"cache on, routed by {policy}" in out and f"'policy': '{policy}'" in out
    assert out.rstrip().splitlines()[-1] == "outputs identical to cache-off run: 4/4 requests"


def test_device_prefix_router_keeps_conversations_on_their_device(tmp_path: Path) -> None:
    """Routed by device_prefix from the nodes' KV events, every follow-up turn lands on the
    node that served the turn before and reuses its device pages (no store load)."""
    spec = WorkloadSpec(num_conversations=3, num_turns=3, context_tokens=120)
    url = f"file://{tmp_path}?capacity=64MiB"
    settings = NodeSettings(model="tiny-hybrid", workload=spec, store_urls=(url, url),
                            num_tokens=4096, kv_events=True)
    with NodePool(settings, 2) as pool, RouterProcess(
            "device_prefix", 2, max_new_tokens=3) as router:
        records, _ = pool.run("store", 3, router=router)
        summary = router.summary()
    follow = [r for r in records.values() if r.turn > 0]
    assert len(follow) == 6
    for rec in follow:
        assert rec.node == records[(rec.conv_id, rec.turn - 1)].node
        assert rec.result.num_from_device > 0 and rec.result.num_from_store == 0
    assert summary["events"] > 0 and summary["device_pages"] > 0
    row = routed_summary("device_prefix", list(records.values()))
    assert row["requests"] == 9 and row["store tok"] == 0


def test_router_process_refuses_unknown_policies_and_missing_facts() -> None:
    """A bad policy fails in the coordinator; nodes without KV events cannot be routed."""
    with pytest.raises(ValueError, match="unknown routing policy"):
        RouterProcess("nearest", 2, max_new_tokens=1)
    with RouterProcess("radixlink", 2, max_new_tokens=1) as router:
        with pytest.raises(ValueError, match="kv_events=True"):
            router.begin(None)
