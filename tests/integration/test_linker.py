"""The external cache linker with the real tree, real KV pools and a memory store: offload on
one cache, lookup + load on another, and every failure path ending with exact accounting."""

from __future__ import annotations

import time

import oracle
import pytest
import serving
import torch

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import PoolName
from radixlink.linker.core import ExternalCacheLinker
from radixlink.memory.layout import KVLayout
from radixlink.stores.faults import FaultyStore
from radixlink.stores.memory import MemoryStore

PS = 4
LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype=torch.float32, page_size=PS)


def make_cache(num_tokens: int = 256) -> UnifiedCache:
    return UnifiedCache(CacheConfig(page_size=PS, num_tokens=num_tokens, kv_layout=LAYOUT,
                                    enable_external_cache_linker=True))


def fill_kv(cache: UnifiedCache, slots: torch.Tensor, tokens: list[int], start: int) -> None:
    """What a model writes for positions ``start..`` of ``tokens`` at ``slots``: K/V that
    depend on the whole prefix and the namespace (tests/oracle.py)."""
    oracle.write(cache, slots, tokens, start)


def serve(cache: UnifiedCache, tokens: list[int]) -> None:
    """One request without a store load (tests/serving.py), computing with ``fill_kv``."""
    serving.serve(cache, tokens,
                  compute=lambda c, kv, t, start: fill_kv(c, kv[start:], t, start))


def kv_of(cache: UnifiedCache, slots: torch.Tensor) -> list[torch.Tensor]:
    pool = cache.pool(PoolName.KV)
    return [t[slots].clone() for layer in range(LAYOUT.num_layers)
            for t in (pool.k(layer), pool.v(layer))]


def assert_exact(cache: UnifiedCache) -> None:
    """Invariants hold and no slot is held by anyone but the tree."""
    cache.check_invariants()
    stats = cache.stats()
    assert stats["held_tokens"] == 0, stats
    assert stats["free_tokens"] + stats["cached_tokens"] == stats["total_tokens"], stats


TOKENS = list(range(100, 140))  # 40 tokens = 10 pages


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore(capacity_bytes=64 << 20)


def offloaded(store, tokens=TOKENS) -> UnifiedCache:
    """Cache A computes ``tokens`` and offloads them (write_through: first insert)."""
    cache_a = make_cache()
    linker_a = ExternalCacheLinker(cache_a, store)
    serve(cache_a, tokens)
    assert linker_a.flush(timeout=10)
    assert linker_a.stats()["offloaded_pages"] == len(tokens) // PS
    node = cache_a.match_prefix(tokens).last_node
    assert node.external_cache_stored
    return cache_a


def test_load_restores_byte_identical_kv_on_another_cache(store) -> None:
    """A offloads; B matches with a req_id, loads, and holds A's exact K/V, matchable after."""
    cache_a = offloaded(store)
    cache_b = make_cache()
    linker_b = ExternalCacheLinker(cache_b, store)
    m = cache_b.match_prefix(TOKENS, req_id="r1")
    assert (m.prefix_len, m.external_hit_len) == (0, 40)
    assert linker_b.load("r1")
    out = linker_b.wait_load("r1", timeout=10)
    assert out.ok and out.prefix_len == 40 and out.loaded_len == 40
    a_slots = cache_a.match_prefix(TOKENS).device_indices
    for x, y in zip(kv_of(cache_a, a_slots), kv_of(cache_b, out.device_indices)):
        assert torch.equal(x, y)
    cache_b.unlock(out.lock)
    assert cache_b.match_prefix(TOKENS).prefix_len == 40
    assert linker_b.stats()["loaded_pages"] == 10
    assert_exact(cache_b)


def test_partial_device_prefix_loads_only_the_tail(store) -> None:
    """B already has the first 3 pages on device; the load brings pages 3..9 only."""
    offloaded(store)
    cache_b = make_cache()
    linker_b = ExternalCacheLinker(cache_b, store)
    serve(cache_b, TOKENS[:12])
    m = cache_b.match_prefix(TOKENS, req_id="r")
    assert (m.prefix_len, m.external_hit_len) == (12, 28)
    assert linker_b.load("r")
    out = linker_b.wait_load("r")
    assert out.ok and out.prefix_len == 40 and out.loaded_len == 28
    assert linker_b.stats().get("loaded_tokens_not_adopted") == 0  # the tree adopted all 28
    cache_b.unlock(out.lock)
    linker_b.flush()
    assert_exact(cache_b)


def test_insert_during_load_trims_the_load_to_adopted_pages(store) -> None:
    """B computes the same prefix itself while its load is in flight: publishing adopts
    nothing, every reserved page is freed once, no slot is leaked or double-owned."""
    offloaded(store)
    slow = FaultyStore(store, delay_ms=200, ops=("get",))
    cache_b = make_cache()
    linker_b = ExternalCacheLinker(cache_b, slow)
    cache_b.match_prefix(TOKENS, req_id="r")
    assert linker_b.load("r")
    serve(cache_b, TOKENS)  # the same pages, computed locally meanwhile
    out = linker_b.wait_load("r", timeout=10)
    assert out.ok and out.prefix_len == 40
    # NOTE: the publish's insert tracks adopted ranges: all 40 loaded tokens were the tree's
    assert linker_b.stats()["loaded_tokens_not_adopted"] == 40
    cache_b.unlock(out.lock)
    linker_b.flush()
    assert_exact(cache_b)


def test_two_loads_of_the_same_pages_share_one_transfer(store) -> None:
    """Two requests for the same prefix: one store transfer, two successful outcomes."""
    offloaded(store)
    cache_b = make_cache()
    linker_b = ExternalCacheLinker(cache_b, FaultyStore(store, delay_ms=50, ops=("get",)))
    for rid in ("r1", "r2"):
        assert cache_b.match_prefix(TOKENS, req_id=rid).external_hit_len == 40
        assert linker_b.load(rid)
    outs = [linker_b.wait_load(rid, timeout=10) for rid in ("r1", "r2")]
    assert all(o.ok and o.prefix_len == 40 for o in outs)
    stats = linker_b.stats()
    assert stats["loads_started"] == 1 and stats["shared_loads"] == 1
    for o in outs:
        cache_b.unlock(o.lock)
    assert_exact(cache_b)


@pytest.mark.parametrize(
    ("knobs", "reason"),
    [
        ({"fail": 1.0, "ops": ("get",)}, "StoreError"),
        ({"corrupt": 1.0}, "bad page"),
        ({"truncate": 1.0}, "bad page"),
    ],
)
def test_failed_load_aborts_and_frees_every_reserved_slot(store, knobs, reason) -> None:
    """A store error, corruption or truncation at get: ok=False, the device prefix only,
    nothing unverified in the tree, accounting exact."""
    offloaded(store)
    faulty = FaultyStore(store, **knobs)
    cache_b = make_cache()
    linker_b = ExternalCacheLinker(cache_b, faulty)
    assert cache_b.match_prefix(TOKENS, req_id="r").external_hit_len == 40
    assert linker_b.load("r")
    out = linker_b.wait_load("r", timeout=10)
    assert not out.ok and out.prefix_len == 0 and reason in out.reason
    cache_b.unlock(out.lock)
    assert cache_b.match_prefix(TOKENS).prefix_len == 0
    assert linker_b.stats()["failures_load"] == 1
    assert_exact(cache_b)


def test_lookup_error_is_a_miss(store) -> None:
    """A store error during LOOKUP reports no external hit and counts the failure."""
    offloaded(store)
    cache_b = make_cache()
    linker_b = ExternalCacheLinker(cache_b, FaultyStore(store, fail=1.0, ops=("exists",)))
    m = cache_b.match_prefix(TOKENS, req_id="r")
    assert m.external_hit_len == 0 and not linker_b.load("r")
    assert linker_b.stats()["failures_lookup"] == 1
    assert_exact(cache_b)


def test_load_timeout_fails_now_and_frees_slots_when_the_worker_returns(store) -> None:
    """A get slower than load_timeout_s: the caller gets ok=False at once; the reserved slots
    stay held until the worker returns, then they are freed (never written after free)."""
    offloaded(store)
    cache_b = make_cache()
    slow = FaultyStore(store, delay_ms=400, ops=("get",))
    linker_b = ExternalCacheLinker(cache_b, slow, load_timeout_s=0.05)
    cache_b.match_prefix(TOKENS, req_id="r")
    assert linker_b.load("r")
    out = linker_b.wait_load("r")
    assert not out.ok and out.reason == "timeout"
    cache_b.unlock(out.lock)
    assert linker_b.flush(timeout=10)
    assert cache_b.match_prefix(TOKENS).prefix_len == 0
    assert_exact(cache_b)


def test_failed_offload_leaves_nodes_unmarked_and_retries_on_next_hit(store) -> None:
    """A put failure leaves external_cache_stored unset; the next hit offloads again."""
    faulty = FaultyStore(store, fail=1.0, ops=("put",))
    cache_a = make_cache()
    linker_a = ExternalCacheLinker(cache_a, faulty)
    serve(cache_a, TOKENS)
    linker_a.flush(timeout=10)
    node = cache_a.match_prefix(TOKENS).last_node
    assert not node.external_cache_stored and node.offload_inflight == 0
    assert linker_a.stats()["failures_offload"] == 1
    faulty.fail = 0.0
    serve(cache_a, TOKENS)
    linker_a.flush(timeout=10)
    assert cache_a.match_prefix(TOKENS).last_node.external_cache_stored
    assert_exact(cache_a)


def test_write_through_selective_waits_for_the_threshold(store) -> None:
    """write_through_selective(threshold=2): nothing goes out on creation, all on reuse."""
    cache = make_cache()
    linker = ExternalCacheLinker(cache, store, write_policy="write_through_selective")
    serve(cache, TOKENS)
    linker.flush()
    assert linker.stats().get("offloads", 0) == 0
    serve(cache, TOKENS)
    linker.flush()
    assert linker.stats()["offloaded_pages"] == 10


def test_write_back_offloads_just_before_eviction(store) -> None:
    """write_back: pages reach the store only when eviction is about to free them."""
    cache = make_cache(num_tokens=48)
    linker = ExternalCacheLinker(cache, store, write_policy="write_back")
    serve(cache, TOKENS)
    linker.flush()
    assert linker.stats().get("offloads", 0) == 0
    serve(cache, list(range(500, 540)))  # needs the room: evicts TOKENS
    linker.flush()
    assert linker.stats()["offloaded_pages"] >= 10
    cache_b = make_cache()
    ExternalCacheLinker(cache_b, store)
    assert cache_b.match_prefix(TOKENS, req_id="r").external_hit_len == 40
    assert_exact(cache)


def test_offloads_past_the_byte_budget_are_dropped_and_counted(store) -> None:
    """With a budget smaller than one chain, offloads are dropped, not queued."""
    cache = make_cache()
    linker = ExternalCacheLinker(cache, store, max_inflight_bytes=1024)
    serve(cache, TOKENS)
    linker.flush()
    assert linker.stats()["dropped_offloads"] == 1
    assert not cache.match_prefix(TOKENS).last_node.external_cache_stored


def test_stale_stored_mark_is_revalidated_and_lost_pages_offloaded_again(store) -> None:
    """The store lost the pages: a hit after revalidate_after_s re-checks and re-offloads."""
    cache = make_cache()
    linker = ExternalCacheLinker(cache, store, revalidate_after_s=0.0)
    serve(cache, TOKENS)
    linker.flush()
    store.clear()
    time.sleep(0.01)
    serve(cache, TOKENS)
    linker.flush()
    stats = linker.stats()
    assert stats["lost_nodes"] >= 1 and stats["offloads"] == 2
    cache_b = make_cache()
    ExternalCacheLinker(cache_b, store)
    assert cache_b.match_prefix(TOKENS, req_id="r").external_hit_len == 40


def test_a_mark_found_fresh_is_rechecked_once_it_ages(store) -> None:
    """Revalidation remembers until when a node's mark is fresh (one rank): hits before then
    do not re-check it, the first hit after the age does, and finds the lost pages."""
    cache = make_cache()
    linker = ExternalCacheLinker(cache, store, revalidate_after_s=0.4)
    serve(cache, TOKENS)
    linker.flush()
    serve(cache, TOKENS)  # fresh: remembered, not re-checked
    node = cache.match_prefix(TOKENS).last_node
    assert node.external_cache_stored and node.stored_fresh[1] > time.monotonic()
    store.clear()
    serve(cache, TOKENS)
    assert linker.stats().get("revalidations", 0) == 0 and node.external_cache_stored
    time.sleep(0.45)
    serve(cache, TOKENS)
    linker.flush()
    stats = linker.stats()
    assert stats["revalidations"] == 1 and stats["lost_nodes"] >= 1, stats
    assert stats["offloads"] == 2, stats


def test_a_mark_moved_back_in_time_is_rechecked_at_once(store) -> None:
    """A confirmation set earlier than the latest one (here through the node's ``stored_at``)
    starts a new epoch of the stored index: what revalidation remembered is not trusted, so
    the next hit re-checks that node."""
    cache = make_cache()
    linker = ExternalCacheLinker(cache, store, revalidate_after_s=300.0)
    serve(cache, TOKENS)
    linker.flush()
    serve(cache, TOKENS)
    node = cache.match_prefix(TOKENS).last_node
    assert node.stored_fresh[1] > time.monotonic() + 200
    node.stored_at = time.monotonic() - 1000.0
    store.clear()
    serve(cache, TOKENS)
    linker.flush()
    stats = linker.stats()
    assert stats["revalidations"] == 1 and stats["lost_nodes"] >= 1, stats


def test_close_with_transfers_in_flight_releases_everything(store) -> None:
    """close() quiesces in-flight loads and offloads, aborts, and releases every lock."""
    offloaded(store)
    cache_b = make_cache()
    linker_b = ExternalCacheLinker(cache_b, FaultyStore(store, delay_ms=100))
    cache_b.match_prefix(TOKENS, req_id="r")
    assert linker_b.load("r")
    serve(cache_b, list(range(600, 640)))  # starts an offload too
    linker_b.close()
    assert cache_b.tree.live_handles() == []
    assert_exact(cache_b)
    assert cache_b.linker is None


def test_no_linker_means_no_lookup(store) -> None:
    """Without a linker, req_id changes nothing and external_hit_len stays 0."""
    offloaded(store)
    cache = make_cache()
    assert cache.match_prefix(TOKENS, req_id="r").external_hit_len == 0
