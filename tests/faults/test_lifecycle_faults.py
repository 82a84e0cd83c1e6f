"""Fault matrix, lifecycle side: close() with transfers in flight, many requests for one prefix
while the store is slow, and one of two tensor-parallel ranks failing a load."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from radixlink.contract import PoolName
from radixlink.linker.core import ExternalCacheLinker
from radixlink.linker.ranks import RankGroup, run_ranks
from radixlink.stores.faults import FaultyStore
from radixlink.stores.memory import MemoryStore

from .kit import TOKENS, assert_exact, kv_matches, make_cache, offload, request

OTHER = list(range(300, 340))


def _fill_free_slots(cache: Any, marker: float) -> torch.Tensor:
    """Take every free slot, write ``marker`` into its K/V, and return the slots."""
    slots = cache.alloc(cache.stats()["free_tokens"])
    pool = cache.pool(PoolName.KV)
    for layer in range(2):
        pool.k(layer)[slots] = marker
        pool.v(layer)[slots] = marker
    return slots


@pytest.mark.parametrize("load_timeout_s", [30.0, 0.05])
def test_close_with_loads_and_offloads_in_flight(store, load_timeout_s) -> None:
    """Flow: two loads (one shared by two requests) and an offload are in flight on a slow
    store; close() waits for every transfer, aborts the loads, releases every lock it holds,
    detaches; no slot stays reserved and no late write lands in memory freed by close (even
    when the loads already timed out)."""
    for tokens in (TOKENS, OTHER):
        cache_a = make_cache()
        linker_a = ExternalCacheLinker(cache_a, store)
        offload(cache_a, linker_a, tokens)
        linker_a.close()
    cache_b = make_cache(num_tokens=512)
    slow = FaultyStore(store, delay_ms=600, ops=("get", "put"))
    linker_b = ExternalCacheLinker(cache_b, slow, load_timeout_s=load_timeout_s)
    for rid, tokens in (("r1", TOKENS), ("r2", TOKENS), ("r3", OTHER)):
        assert cache_b.match_prefix(tokens, req_id=rid).external_hit_len == 40
        assert linker_b.load(rid)
    request(cache_b, linker_b, list(range(700, 740)), "local")  # write_through: an offload
    # NOTE: one lock per transfer's reservation (2), for all its waiting requests (3)
    assert cache_b.stats()["held_tokens"] == 80 and len(cache_b.tree.live_handles()) == 2
    linker_b.close()
    assert cache_b.linker is None and cache_b.tree.live_handles() == []
    assert_exact(cache_b)
    assert cache_b.match_prefix(TOKENS).prefix_len == 0  # nothing published after close
    marked = _fill_free_slots(cache_b, -7.0)
    time.sleep(0.7)  # a straggling worker write would land now
    pool = cache_b.pool(PoolName.KV)
    assert bool((pool.k(0)[marked] == -7.0).all()) and bool((pool.v(1)[marked] == -7.0).all())
    cache_b.free(marked)
    with pytest.raises(ValueError):
        linker_b.wait_load("r1")  # the outcome went with close; the caller gets a clear error
    linker_b.close()  # idempotent
    assert_exact(cache_b)


def test_close_releases_outcomes_nobody_collected(store) -> None:
    """A load finished but its outcome was never polled: close() unlocks it."""
    cache_a = make_cache()
    offload(cache_a, ExternalCacheLinker(cache_a, store))
    cache_b = make_cache()
    linker_b = ExternalCacheLinker(cache_b, store)
    cache_b.match_prefix(TOKENS, req_id="r")
    assert linker_b.load("r")
    assert linker_b.flush(timeout=30)  # applied: the outcome waits in the linker
    assert len(cache_b.tree.live_handles()) == 1
    linker_b.close()
    assert_exact(cache_b)
    assert cache_b.match_prefix(TOKENS).prefix_len == 40  # it was verified and published


@pytest.mark.parametrize("fail", [False, True])
def test_many_requests_for_one_prefix_share_one_transfer(store, link, fail) -> None:
    """Eight requests for the same 10 pages while the store is slow: one transfer (one batched
    get of 10 pages), eight outcomes with one result. When that transfer fails, all eight fail
    and each recomputes; accounting is exact either way."""
    cache_a = make_cache()
    offload(cache_a, link(cache_a, store))
    faulty = FaultyStore(store, delay_ms=150, ops=("get",), fail=1.0 if fail else 0.0)
    cache_b = make_cache()
    linker_b = link(cache_b, faulty)
    hits_before = store.stats()["hits"]
    rids = [f"r{i}" for i in range(8)]
    for rid in rids:
        assert cache_b.match_prefix(TOKENS, req_id=rid).external_hit_len == 40
        assert linker_b.load(rid)
    outs = [linker_b.wait_load(rid, timeout=30) for rid in rids]
    stats = linker_b.stats()
    assert (stats["loads_started"], stats["shared_loads"]) == (1, 7)
    assert store.stats()["hits"] - hits_before == (0 if fail else 10)
    assert all(out.ok is not fail for out in outs)
    if not fail:
        assert all(torch.equal(out.device_indices, outs[0].device_indices) for out in outs)
        assert kv_matches(cache_b, outs[0].device_indices, TOKENS, 0)
    for out in outs:
        cache_b.unlock(out.lock)
    assert_exact(cache_b)


def test_requests_for_nested_prefixes_load_and_publish_once(store, link) -> None:
    """Requests for a prefix and for its extension arrive together: two transfers (different
    pages), and publishing the second frees its duplicate pages; no slot leaks."""
    cache_a = make_cache()
    offload(cache_a, link(cache_a, store))
    cache_b = make_cache()
    linker_b = link(cache_b, FaultyStore(store, delay_ms=50, ops=("get",)))
    wants = {"short": TOKENS[:20], "long": TOKENS, "short2": TOKENS[:20]}
    for rid, tokens in wants.items():
        assert linker_b.load(rid) is False  # no lookup yet: nothing to load
        assert cache_b.match_prefix(tokens, req_id=rid).external_hit_len == len(tokens)
        assert linker_b.load(rid)
    outs = {rid: linker_b.wait_load(rid, timeout=30) for rid in wants}
    assert all(out.ok and out.prefix_len == len(wants[rid]) for rid, out in outs.items())
    assert linker_b.stats()["loads_started"] == 2
    for out in outs.values():
        cache_b.unlock(out.lock)
    assert_exact(cache_b)


def _rank_flow(store: MemoryStore, failing_rank: int, knobs: dict[str, Any]):
    def flow(group: RankGroup) -> dict[str, Any]:
        cache_a = make_cache()
        linker_a = ExternalCacheLinker(cache_a, store, ranks=group)
        offload(cache_a, linker_a)  # keys carry the rank: /r0 and /r1
        linker_a.close()
        mine = FaultyStore(store, **knobs) if group.rank == failing_rank else store
        cache_b = make_cache()
        linker_b = ExternalCacheLinker(cache_b, mine, ranks=group)
        result = request(cache_b, linker_b, TOKENS, "r")
        linker_b.close()
        assert_exact(cache_b)
        return {**result, "stats": linker_b.stats()}

    return flow


@pytest.mark.parametrize(
    ("knobs", "stage"),
    [({"fail": 1.0, "ops": ("get",)}, "load"), ({"corrupt": 1.0}, "load"),
     ({"fail": 1.0, "ops": ("exists",)}, "lookup")],
)
def test_one_of_two_ranks_failing_fails_the_load_on_both(store, knobs, stage) -> None:
    """Two simulated ranks over one store, rank 1 behind a fault: when rank 1's get fails (or
    reads corrupt pages) both ranks abort the load (AND of success flags) and recompute; when
    its lookup fails, both see no hit (intersection). Both end exact."""
    rank0, rank1 = run_ranks(2, _rank_flow(store, 1, knobs), timeout_s=30)
    for result in (rank0, rank1):
        assert result["prefix"] == 0, result
        if stage == "load":
            assert result["hit"] == 40 and result["ok"] is False
            assert result["stats"]["failures_load"] == 1
        else:
            assert result["hit"] == 0 and result["ok"] is None
    if stage == "load":
        assert rank0["reason"] == "another rank failed", rank0["reason"]


def test_two_healthy_ranks_both_load(store) -> None:
    """Control: with no fault, both ranks load all 10 pages of their own rank's keys."""
    rank0, rank1 = run_ranks(2, _rank_flow(store, 1, {}), timeout_s=30)
    assert rank0["ok"] and rank1["ok"] and rank0["prefix"] == rank1["prefix"] == 40


def test_ranks_whose_offloads_finish_at_different_times_stay_aligned(store) -> None:
    """Flow: both ranks insert (an offload each); rank 1's store is slow, so at the next insert
    rank 0's offload has finished and rank 1's has not. Applying it must not start a collective
    on rank 0 alone (that would meet rank 1's next LOOKUP collective): the ranks agree on how
    many completions to apply, and both then serve, load and offload normally."""

    def flow(group: RankGroup) -> dict[str, Any]:
        mine = FaultyStore(store, delay_ms=300, ops=("put",)) if group.rank else store
        cache = make_cache()
        linker = ExternalCacheLinker(cache, mine, ranks=group)
        request(cache, linker, TOKENS, "r1")
        time.sleep(0.1)  # rank 0's put is done, rank 1's is not
        request(cache, linker, OTHER, "r2")
        result = request(cache, linker, TOKENS[:20] + OTHER, "r3")
        assert linker.flush(timeout=30)
        linker.close()
        assert_exact(cache)
        return {**result, "stats": linker.stats()}

    rank0, rank1 = run_ranks(2, flow, timeout_s=30)
    assert rank0["stats"]["offloaded_pages"] == rank1["stats"]["offloaded_pages"] >= 20


def test_a_timeout_on_one_rank_times_out_the_load_on_both(store) -> None:
    """Rank 1's get outlasts load_timeout_s while rank 0's returns at once: the ranks agree
    that the load timed out (both get "timeout", neither publishes), stay aligned through the
    late completion, and both load normally once the store is fast again."""
    for tokens in (TOKENS, OTHER):
        run_ranks(2, lambda g, t=tokens: offload(c := make_cache(), ExternalCacheLinker(
            c, store, ranks=g), t), timeout_s=30)

    def flow(group: RankGroup) -> dict[str, Any]:
        mine = FaultyStore(store, delay_ms=800 if group.rank else 0, ops=("get",))
        cache = make_cache()
        linker = ExternalCacheLinker(cache, mine, ranks=group, load_timeout_s=0.3)
        first = request(cache, linker, TOKENS, "r1")
        mine.delay_ms = 0
        assert linker.flush(timeout=30)  # the late completion: applied on both, aborted
        second = request(cache, linker, OTHER, "r2")
        assert linker.flush(timeout=30)
        linker.close()
        assert_exact(cache)
        return {"first": first, "second": second}

    for result in run_ranks(2, flow, timeout_s=30):
        assert result["first"]["ok"] is False and result["first"]["reason"] == "timeout", result
        assert result["second"]["ok"] and result["second"]["prefix"] == 40, result
