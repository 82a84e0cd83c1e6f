"""Two real tensor-parallel ranks (processes, gloo) each running a cache + linker over one shared
directory store: a failure on one rank decides for both, and replicated pools are written once.

Each rank runs ``_RANK_SCRIPT`` in a child Python; they meet through a gloo FileStore rendezvous
and write their observations as JSON.
"""

from __future__ import annotations

from pathlib import Path

from gloo_ranks import python_command, run_gloo_ranks

_RANK_SCRIPT = r"""
import dataclasses, json, sys
import torch.distributed as dist
from faults.kit import LAYOUT, MODEL_NS, PS, TOKENS, make_cache, serve
from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.linker import TorchRankGroup
from radixlink.linker.core import ExternalCacheLinker
from radixlink.stores import open_store
from radixlink.stores.faults import FaultyStore

rank, rendezvous, out, root = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method="file://" + rendezvous, rank=rank, world_size=2)
group = TorchRankGroup()
url = lambda name: "file://" + root + "/" + name + "?capacity=64MiB"
res = {}

def exact(cache):
    cache.check_invariants()
    s = cache.stats()
    return s["held_tokens"] == 0 and s["free_tokens"] + s["cached_tokens"] == s["total_tokens"]

# 1. Every put fails on rank 1 only: the node stays unmarked on BOTH ranks.
base = open_store(url("offload"))
store = FaultyStore(base, fail=1.0, ops=("put",)) if rank == 1 else base
cache = make_cache(namespace=MODEL_NS)
linker = ExternalCacheLinker(cache, store, ranks=group)
serve(cache, TOKENS)
linker.flush(timeout=30)
res["offload_marked"] = cache.match_prefix(TOKENS).last_node.external_cache_stored
res["offload_exact"] = exact(cache)
linker.close()

# 2. Both ranks offload; then a get fails on rank 1 only: the load aborts on BOTH ranks.
healthy = open_store(url("load"))
cache_a = make_cache(namespace=MODEL_NS)
linker_a = ExternalCacheLinker(cache_a, healthy, ranks=group)
serve(cache_a, TOKENS)
linker_a.flush(timeout=30)
res["a_marked"] = cache_a.match_prefix(TOKENS).last_node.external_cache_stored
linker_a.close()
store_b = FaultyStore(healthy, fail=1.0, ops=("get",)) if rank == 1 else healthy
cache_b = make_cache(namespace=MODEL_NS)
linker_b = ExternalCacheLinker(cache_b, store_b, ranks=group)
res["hit"] = cache_b.match_prefix(TOKENS, req_id="r").external_hit_len
res["started"] = linker_b.load("r")
outcome = linker_b.wait_load("r", timeout=30)
res["load_ok"], res["load_prefix"] = outcome.ok, outcome.prefix_len
cache_b.unlock(outcome.lock)
linker_b.close()
res["load_exact"] = exact(cache_b)
res["b_matches"] = cache_b.match_prefix(TOKENS).prefix_len

# 3. Replicated pools are written by rank 0 only; per-rank pools carry the rank in the key.
for replicated in (True, False):
    layout = dataclasses.replace(LAYOUT, replicated=replicated)
    cache = UnifiedCache(CacheConfig(page_size=PS, num_tokens=256, kv_layout=layout,
                                     namespace=MODEL_NS, enable_external_cache_linker=True))
    linker = ExternalCacheLinker(cache, url("rep%d" % replicated), ranks=group)
    serve(cache, TOKENS)
    linker.flush(timeout=30)
    res["rep%d_marked" % replicated] = cache.match_prefix(TOKENS).last_node.external_cache_stored
    linker.close()
    group.all_ok(True)  # NOTE: a barrier: both ranks have written before anyone lists keys
    listing = open_store(url("rep%d" % replicated)).scan()
    res["rep%d_keys" % replicated] = sorted(key for key, _ in listing)

dist.destroy_process_group()
open(out, "w").write(json.dumps(res))
"""


def test_two_process_ranks_decide_failures_together(tmp_path: Path) -> None:
    """Rank 1 failing an offload leaves the node unmarked on both ranks; rank 1 failing a load
    aborts it on both with exact accounting; replicated pools are written once, by rank 0."""
    ranks = run_gloo_ranks(python_command(_RANK_SCRIPT), tmp_path, str(tmp_path))
    for res in ranks:
        assert res["offload_marked"] is False and res["offload_exact"] is True
        assert res["a_marked"] is True
        assert res["hit"] == 40 and res["started"] is True
        assert res["load_ok"] is False and res["load_prefix"] == 0
        assert res["load_exact"] is True and res["b_matches"] == 0
        assert res["rep1_marked"] is True and res["rep0_marked"] is True
    pages = 10
    replicated_keys, per_rank_keys = ranks[0]["rep1_keys"], ranks[0]["rep0_keys"]
    assert len(replicated_keys) == pages, "a replicated pool is written once"
    assert not any("/r" in key.rsplit("/kv", 1)[-1] for key in replicated_keys)
    assert len(per_rank_keys) == 2 * pages, "per-rank pools hold one copy per rank"
    assert {key.rsplit("/", 1)[-1] for key in per_rank_keys} == {"r0", "r1"}
    assert ranks[1]["rep1_keys"] == replicated_keys
