"""A store that loses only one rank's pages (issue #24, item 1): two real tensor-parallel ranks
(processes, gloo) share a directory store; rank 1's ``/r1`` pages are deleted behind their back
(as allkeys-lru or a directory cap evicts keys independently). Revalidation must decide alike
on both ranks, so their collectives keep pairing: both answer every request, both re-offload
the lost node, and a peer then hits the whole prefix again. The ranks report as JSON.
"""

from __future__ import annotations

from pathlib import Path

from gloo_ranks import RANK_PROLOGUE, python_command, run_gloo_ranks

_RANK_SCRIPT = RANK_PROLOGUE + r"""
from faults.kit import TOKENS, assert_exact, make_cache, request
from radixlink.hashing import Namespace
from radixlink.linker.core import ExternalCacheLinker
from radixlink.stores import open_store

url = "file://" + root + "/store?capacity=64MiB"
ns = Namespace(model="test-model")
res = {"answers": [], "peer": []}

cache = make_cache(namespace=ns)
linker = ExternalCacheLinker(cache, url, ranks=group, revalidate_after_s=0)
res["answers"].append(request(cache, linker, TOKENS, "r0"))
assert linker.flush(timeout=30)
res["marked"] = cache.match_prefix(TOKENS).last_node.external_cache_stored
group.all_ok(True)  # NOTE: a barrier: both ranks have written before rank 1's pages go
if rank == 1:
    store = open_store(url)
    lost = [key for key, _ in store.scan() if key.endswith("/r1")]
    res["deleted"] = store.delete(lost)
    store.close()
group.all_ok(True)
for i in range(1, 6):  # each hit revalidates (revalidate_after_s=0)
    res["answers"].append(request(cache, linker, TOKENS, "r%d" % i))
    assert linker.flush(timeout=30)
res["marked_after"] = cache.match_prefix(TOKENS).last_node.external_cache_stored
res["stats"] = {k: linker.stats().get(k, 0) for k in ("lost_nodes", "revalidations",
                                                      "failures_revalidate", "offload_batches")}
linker.close()
assert_exact(cache)

peer = make_cache(namespace=ns)
with ExternalCacheLinker(peer, url, ranks=group) as peer_linker:
    res["peer"].append(request(peer, peer_linker, TOKENS, "p"))
assert_exact(peer)
dist.destroy_process_group()
open(out, "w").write(json.dumps(res))
"""


def test_ranks_agree_on_revalidation_when_one_rank_loses_pages(tmp_path: Path) -> None:
    """Rank 1's pages vanish: both ranks answer all six requests (no collective mismatch,
    no exception), both unmark and re-offload the node, and a peer loads the whole prefix."""
    ranks = run_gloo_ranks(python_command(_RANK_SCRIPT), tmp_path, str(tmp_path),
                           timeout_s=180)
    assert ranks[1]["deleted"] == 10, "rank 1's ten pages were in the store"
    for res in ranks:
        assert res["marked"] is True
        assert len(res["answers"]) == 6 and all(a["prefix"] in (0, 40) for a in res["answers"])
        assert res["stats"]["lost_nodes"] == 1, res["stats"]
        assert res["stats"]["failures_revalidate"] == 0, res["stats"]
        assert res["marked_after"] is True
        assert res["peer"][0]["hit"] == 40 and res["peer"][0]["ok"] is True
    assert ranks[0]["stats"] == ranks[1]["stats"], "the ranks decided alike"
