"""The DESIGN.md load hooks (``build_external_linker_transfer`` LOAD, then
``update_external_linker_load`` PREPARE / COMMIT / ABORT) as thin adapters over the components'
typed ``ComponentLoad`` steps: what they reserve is released by ABORT or taken by the insert."""

from __future__ import annotations

from dataclasses import dataclass

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import (
    ExternalLinkerLoadPhase,
    InsertParams,
    LinkerTransferPhase,
    PoolName,
    PoolTransfer,
)

PS = 4


@dataclass
class Req:
    swa_evicted_seqlen: int = 0


def make() -> UnifiedCache:
    return UnifiedCache(CacheConfig(page_size=PS, num_tokens=64, sliding_window=8,
                                    swa_num_tokens=64, mamba_num_states=4))


def prepared(cache: UnifiedCache, req: Req, keys: list[str]) -> list[PoolTransfer | None]:
    transfers: list[PoolTransfer | None] = []
    full = None
    for component in cache.components:
        t = component.build_external_linker_transfer(LinkerTransferPhase.LOAD, None, keys)
        assert t is not None and t.device_indices is not None
        full = t if full is None else full
        transfers.append(component.update_external_linker_load(
            ExternalLinkerLoadPhase.PREPARE, req, full, t, 0))
    return transfers


def held(cache: UnifiedCache) -> tuple[int, int, int]:
    s = cache.stats()
    return s["held_tokens"], s["swa_held_tokens"], s["mamba_held_states"]


def test_load_prepare_abort_through_the_hooks_holds_nothing_after() -> None:
    cache, req, keys = make(), Req(), ["a", "b", "c"]
    transfers = prepared(cache, req, keys)
    assert [t.name for t in transfers if t] == [PoolName.KV, PoolName.SWA, PoolName.MAMBA]
    assert held(cache) == (12, 8, 1) and req.swa_evicted_seqlen == 4
    full = transfers[0]
    for component, t in reversed(list(zip(cache.components, transfers, strict=True))):
        assert component.update_external_linker_load(
            ExternalLinkerLoadPhase.ABORT, req, full, t, 0) is None
    assert held(cache) == (0, 0, 0)
    cache.check_invariants()


def test_load_prepare_insert_commit_through_the_hooks_leaves_the_tree_owner() -> None:
    cache, req, keys = make(), Req(), ["a", "b", "c"]
    transfers = prepared(cache, req, keys)
    full, mamba = transfers[0], transfers[2]
    assert full is not None and full.device_indices is not None and mamba is not None
    assert mamba.device_indices is not None
    result = cache.insert_loaded(InsertParams(
        key=list(range(12)), value=full.device_indices, swa_evicted_seqlen=req.swa_evicted_seqlen,
        mamba_value=int(mamba.device_indices[0]), track_adopted_ranges=True))
    for component, t in zip(cache.components, transfers, strict=True):
        assert component.update_external_linker_load(
            ExternalLinkerLoadPhase.COMMIT, req, full, t, 0, insert_result=result) is t
    assert held(cache) == (0, 0, 0)
    assert cache.match_prefix(list(range(12))).prefix_len == 12
    cache.check_invariants()


def test_lookup_and_offload_hooks_name_each_pool_and_its_policy() -> None:
    cache = make()
    names = [c.build_external_linker_transfer(LinkerTransferPhase.LOOKUP, None, ["a"])
             for c in cache.components]
    assert [(t.name, t.hit_policy.name) for t in names if t] == [
        (PoolName.KV, "ALL_PAGES"), (PoolName.SWA, "TRAILING_PAGES"),
        (PoolName.MAMBA, "TRAILING_PAGES")]
