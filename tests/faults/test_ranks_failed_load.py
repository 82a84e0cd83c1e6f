"""D1 (issue #44): a load that fails on one tensor-parallel rank must not desynchronise the ranks.

The flow (``flow``, run by every rank): both ranks offload a prompt (write_back: eviction
exports it), so each rank's stored index holds its pages; then a longer request looks those
pages up and loads them, and rank 1's read finds them corrupt (or missing: its ``/r1`` pages
vanish between the lookup and the get) while rank 0's read is fine. The ranks agree the load
failed and both recompute. Before the fix only rank 1 dropped the pages from its stored index,
so a later request that split the recomputed node found a stored mark on rank 0 only:
revalidation's all-reduce ran on rank 0 alone, and the next collective was mismatched
("ranks sent sizes [1, N]" simulated; an abort or a hang with gloo / NCCL).

Run here on two simulated ranks (threads) and on two real processes over gloo.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gloo_ranks import RANK_PROLOGUE, python_command, run_gloo_ranks

from faults.kit import MODEL_NS, TOKENS, assert_exact, make_cache, request
from faults.recording_ranks import RecordingGroup
from radixlink.linker.core import ExternalCacheLinker
from radixlink.linker.ranks import RankGroup, run_ranks
from radixlink.stores.base import Store
from radixlink.stores.faults import FaultyStore
from radixlink.stores.memory import MemoryStore

LONG = TOKENS + list(range(500, 508))  # the offloaded 10 pages, then 2 more
SPLIT = TOKENS + list(range(600, 608))  # shares the 10 pages, then diverges: splits LONG's node


def flow(group: RankGroup, shared: Store, variant: str) -> dict[str, Any]:
    """One rank's part (see the module docstring); what it served and decided, as JSON."""
    recording = RecordingGroup(group)
    mine = FaultyStore(shared)
    cache = make_cache(namespace=MODEL_NS)
    linker = ExternalCacheLinker(cache, mine, ranks=recording, write_policy="write_back")
    served = [request(cache, linker, TOKENS, "warm")]
    cache.evict(10**6)  # write_back exports the prompt before its pages go
    assert linker.flush(timeout=30)
    known = linker.stats()["known_pages"]

    # The load: rank 0 reads good pages, rank 1 corrupt (or missing) ones.
    m = cache.match_prefix(LONG, req_id="load")
    if group.rank == 1:
        if variant == "corrupt":
            mine.corrupt = 1.0
        else:
            shared.delete([key for key, _ in shared.scan() if key.endswith("/r1")])
    started = linker.load("load")
    out = linker.wait_load("load", timeout=30)
    cache.unlock(out.lock)
    mine.corrupt = 0.0
    loaded = {"hit": m.external_hit_len, "started": started, "ok": out.ok}

    # The ranks go on: recompute, split the recomputed node (revalidation looks at the marks
    # on the path), hit the device, look up again.
    for rid, tokens in (("recompute", LONG), ("split", SPLIT), ("again", TOKENS),
                        ("other", SPLIT + [7] * 9)):
        served.append(request(cache, linker, tokens, rid))
    assert linker.flush(timeout=30)
    fragment = cache.match_prefix(TOKENS).last_node
    result = {"served": served, "load": loaded, "known_before": known,
              "fragment_stored": fragment.external_cache_stored,
              "calls": recording.calls, "stats": {k: linker.stats().get(k, 0) for k in (
                  "failures_load", "checksum_misses", "lost_nodes", "loads_started")}}
    linker.close()
    assert_exact(cache)
    return result


def _check(ranks: list[dict[str, Any]], variant: str) -> None:
    rank0, rank1 = ranks
    for res in ranks:
        assert res["known_before"] == 10, res  # both indexes held the prompt's pages
        assert res["load"] == {"hit": 40, "started": True, "ok": False}, res["load"]
        assert res["stats"]["failures_load"] == 1, res["stats"]
        prefixes = [answer["prefix"] for answer in res["served"]]
        assert prefixes == [0, 0, 40, 40, 48], prefixes
    assert rank0["served"] == rank1["served"], "the ranks served the same prefixes"
    assert rank0["calls"] == rank1["calls"], "the ranks made the same collectives"
    assert rank0["fragment_stored"] == rank1["fragment_stored"], "the stored marks agree"
    if variant == "corrupt":
        assert rank1["stats"]["checksum_misses"] == 1 and rank0["stats"]["checksum_misses"] == 0


@pytest.mark.parametrize("variant", ["corrupt", "missing"])
def test_a_load_failing_on_one_simulated_rank_keeps_the_ranks_in_step(variant: str) -> None:
    """Two simulated ranks: the load fails on rank 1 only; both abort, recompute, and keep
    serving the same prefixes with the same collectives (no mismatched collective)."""
    shared = MemoryStore(capacity_bytes=64 << 20)
    _check(run_ranks(2, lambda group: flow(group, shared, variant), timeout_s=20), variant)


_RANK_SCRIPT = RANK_PROLOGUE + r"""
from faults.test_ranks_failed_load import flow
from radixlink.stores import open_store

variant = sys.argv[5]
shared = open_store("file://" + root + "/store?capacity=64MiB")
res = flow(group, shared, variant)
dist.destroy_process_group()
open(out, "w").write(json.dumps(res))
"""


@pytest.mark.parametrize("variant", ["corrupt", "missing"])
def test_a_load_failing_on_one_gloo_rank_keeps_the_processes_in_step(tmp_path: Path,
                                                                      variant: str) -> None:
    """Two real processes over gloo (a 30 s collective timeout, a 120 s limit per run): rank
    1's read of a load fails, rank 0's succeeds; both abort, then serve four more requests
    with the same prefixes and the same collectives, and end exact."""
    ranks = run_gloo_ranks(python_command(_RANK_SCRIPT), tmp_path, str(tmp_path), variant,
                           timeout_s=120)
    for res in ranks:
        res["calls"] = [tuple(call) for call in res["calls"]]
    _check(ranks, variant)
