"""Regressions of the load path (issue #13): publish inserts exactly the prefix LOAD locked, the
tree's own queries change nothing, offload marks survive splits and losses, and every request
owns its deadline and can cancel. Each test names the defect it pins."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import torch
from hybrid_kit import (
    PS,
    TOKENS,
    assert_exact,
    make_cache,
    matched,
    offloaded,
    serve,
    window_and_state,
)

from radixlink.contract import EvictParams, InsertParams, PoolName, PoolTransfer
from radixlink.hashing import Namespace, page_hashes
from radixlink.linker.core import ExternalCacheLinker
from radixlink.stores.base import Store
from radixlink.stores.faults import FaultyStore
from radixlink.stores.memory import MemoryStore


class GatedStore(Store):
    """A real store whose ``get`` of any key in ``gated`` waits until ``open`` is set (a store
    that is slow for one transfer only)."""

    def __init__(self, inner: Store):
        self.inner = inner
        self.gated: set[str] = set()
        self.open = threading.Event()

    @property
    def shared(self) -> bool:  # type: ignore[override]
        return self.inner.shared

    def exists(self, keys: Sequence[str]) -> list[bool]:
        return self.inner.exists(keys)

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        if self.gated.intersection(keys):
            self.open.wait(30)
        return self.inner.get(keys)

    def put(self, items: Mapping[str, bytes]) -> list[bool]:
        return self.inner.put(items)

    def delete(self, keys: Sequence[str]) -> int:
        return self.inner.delete(keys)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore(capacity_bytes=64 << 20)


def finish(cache: Any, linker: ExternalCacheLinker, rid: str) -> Any:
    out = linker.wait_load(rid, timeout=10)
    cache.unlock(out.lock)
    return out


# ---------------------------------------------------------------- 1. publish what was locked


def test_publish_keeps_the_locked_prefix_when_no_state_slot_is_free(store) -> None:
    """#13.1: B holds TOKENS[:20] with its state and loads [20, 40); before the transfer lands,
    other requests take every free state slot. The old publish re-matched the device prefix
    (which needed a state copy), got an empty match and inserted the loaded pages at position
    0; now it inserts the locked prefix + loaded pages: B's K/V and states equal A's."""
    cache_a, _ = offloaded("mamba", store)
    cache_b = make_cache("mamba", num_states=4)
    linker_b = ExternalCacheLinker(cache_b, FaultyStore(store, delay_ms=100, ops=("get",)))
    serve(cache_b, TOKENS[:20])
    m = cache_b.match_prefix(TOKENS, req_id="r")
    assert m.prefix_len == 20 and m.external_hit_len == 20 and linker_b.load("r")
    held = []
    while (slot := cache_b.hybrid.alloc_state()) is not None:
        held.append(slot)
    out = finish(cache_b, linker_b, "r")
    assert out.ok and out.prefix_len == 40 and out.loaded_len == 20
    assert all(torch.equal(x, y) for x, y in zip(window_and_state(cache_b, TOKENS),
                                                 window_and_state(cache_a, TOKENS)))
    for slot in held:
        cache_b.hybrid.free_state(slot)
    linker_b.close()
    assert_exact(cache_b)


@pytest.mark.parametrize("evict", [False, True])
@pytest.mark.parametrize("kind", ["full", "swa+mamba"])
def test_a_load_matches_the_tree_once_and_locks_its_device_prefix_once(
    kind: str, evict: bool, store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#46: from match_prefix(req_id) to the outcome a load walks the tree for its tokens once
    (the lookup's match; the publish reads the path its own insert built) and takes one lock
    on the device prefix (the reservation's, for every request sharing the transfer) plus
    the outcome's on the restored prefix, which the caller takes. It used to match three
    times (lookup, load's peek, publish's peek) and lock the device prefix twice. When tree
    data was freed between the lookup and load() (an unrelated eviction here), load() checks
    the device prefix once more, and the load still restores exactly."""
    offloaded(kind, store)
    cache_b = make_cache(kind)
    linker_b = ExternalCacheLinker(cache_b, store)
    serve(cache_b, list(range(900, 916)))  # NOTE: older than the prefix: eviction takes it
    serve(cache_b, TOKENS[:8])
    calls: Counter[str] = Counter()
    for name, owner in (("match", cache_b.tree), ("lock", cache_b.tree.locks)):
        real = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, _f=real, _n=name, **k: (
            calls.update([_n]), _f(*a, **k))[1])
    m = cache_b.match_prefix(TOKENS, req_id="r")
    assert (m.prefix_len, m.external_hit_len) == (8, 32) and calls == {"match": 1}
    if evict:
        assert cache_b.evict(4) >= 4 and matched(cache_b, list(range(900, 916))) == 0
    calls.clear()  # NOTE: count from load() on
    assert linker_b.load("r")
    out = linker_b.wait_load("r", timeout=10)
    cache_b.unlock(out.lock)
    assert (out.ok, out.prefix_len, out.loaded_len) == (True, 40, 32)
    assert calls == ({"match": 1, "lock": 2} if evict else {"lock": 2}), calls
    linker_b.close()
    assert_exact(cache_b)


@pytest.mark.parametrize("kind", ["swa", "mamba"])
def test_load_refuses_a_device_prefix_that_lost_its_window_or_state(kind: str, store) -> None:
    """#13.1: between match_prefix(req_id) and load(), eviction drops the SWA window / Mamba
    state of the device-prefix node while the node stays (it is internal). The old load locked
    the node and its publish re-matched a shorter prefix (pages misplaced, or a ValueError from
    wait_load and slots leaked); now load() sees the change, refuses and holds nothing."""
    offloaded(kind, store)
    cache_b = make_cache(kind)
    linker_b = ExternalCacheLinker(cache_b, store)
    serve(cache_b, TOKENS[:20])
    child = TOKENS[:20] + list(range(500, 520))
    grandchild = child + list(range(520, 528))
    serve(cache_b, child)  # [0, 20) is now internal
    serve(cache_b, grandchild)
    m = cache_b.match_prefix(TOKENS, req_id="r")
    assert m.prefix_len == 20 and m.external_hit_len == 20
    # NOTE: a lock far below [0, 20): its window and state locks do not reach that node
    keep = cache_b.lock(cache_b.match_prefix(grandchild).last_node)
    target = EvictParams(swa_num_tokens=256) if kind == "swa" else EvictParams(mamba_num=16)
    cache_b.evict(target)
    assert cache_b.match_prefix(TOKENS[:20]).prefix_len == 0  # the node stays, unmatchable
    assert not linker_b.load("r")
    assert linker_b.stats()["stale_lookups"] == 1
    cache_b.unlock(keep)
    linker_b.close()
    assert_exact(cache_b)


# ---------------------------------------------------------------- 3-5. offload marks


def test_split_fragment_of_an_offload_in_flight_is_marked_when_it_lands(store) -> None:
    """#13.3: node [0, 40) is being offloaded; an insert diverging at 20 splits it and the back
    part [20, 40) is evicted before the offload finishes. The old finish reached fragments via
    node.parent (cleared by the eviction): the front [0, 20) stayed 'in flight' forever."""
    cache = make_cache("full")
    linker = ExternalCacheLinker(cache, FaultyStore(store, delay_ms=200, ops=("put",)))
    serve(cache, TOKENS)
    node = cache.match_prefix(TOKENS).last_node
    assert node.offload_inflight
    serve(cache, TOKENS[:20] + list(range(600, 620)))
    front = node.parent
    assert front.offload_inflight == node.offload_inflight
    cache.evict(20)  # LRU: the back part [20, 40) goes
    assert node.seq_len < 0 and front.seq_len == 20
    assert linker.flush(timeout=10)
    assert front.offload_inflight == 0 and front.external_cache_stored
    linker.close()
    assert_exact(cache)


def test_an_ancestor_the_store_lost_is_exported_again(store) -> None:
    """#13.4: system prompt S and S+T are stored; the store loses S's pages; after
    revalidation clears S's mark, the next request S+T+U must export S again. The old
    backup_chain stopped at S+T (still marked) and S stayed missing for good."""
    cache = make_cache("full")
    linker = ExternalCacheLinker(cache, store, revalidate_after_s=0.0)
    s, st = TOKENS[:20], TOKENS[:32]
    serve(cache, s)
    serve(cache, st)
    assert linker.flush(timeout=10)
    s_node = cache.match_prefix(s).last_node
    keys = linker.parts.store_keys(PoolTransfer(name=PoolName.KV, keys=list(s_node.hash_value)),
                             cache.config.namespace)
    assert store.delete(keys) == len(keys)
    serve(cache, st + list(range(700, 708)))
    assert linker.flush(timeout=10)
    assert all(store.exists(keys)) and s_node.external_cache_stored
    linker.close()
    assert_exact(cache)


def test_write_back_exports_a_state_before_its_own_eviction_frees_it(store) -> None:
    """#13.5: write_back, node X internal (child X+Y locked); evicting one state tombstones
    X's state while X stays. The old tree called before_evict only for full-KV evictions, so
    X (and its state) never reached the store; now X's pages and state are exported first."""
    cache = make_cache("mamba")
    linker = ExternalCacheLinker(cache, store, write_policy="write_back")
    x, xy = TOKENS[:20], TOKENS
    serve(cache, x)
    serve(cache, xy)
    keep = cache.lock(cache.match_prefix(xy).last_node)
    x_node = cache.match_prefix(x).last_node
    state_key = linker.parts.store_keys(PoolTransfer(name=PoolName.MAMBA,
                                               keys=[x_node.hash_value[-1]]))
    assert not any(store.exists(state_key))
    assert cache.evict(EvictParams(mamba_num=1)).mamba_num_evicted == 1
    assert linker.flush(timeout=10)
    assert all(store.exists(state_key)) and x_node.external_cache_stored
    cache.unlock(keep)
    linker.close()
    assert_exact(cache)


# ---------------------------------------------------------------- 6-8. deadlines, cancel


def test_a_followers_short_wait_fails_only_the_follower(store) -> None:
    """#13.6: two requests share one slow transfer; the follower waits with timeout=0.05 and
    fails alone; the leader, whose deadline is far away, still gets its pages."""
    offloaded("full", store)
    cache = make_cache("full")
    linker = ExternalCacheLinker(cache, FaultyStore(store, delay_ms=300, ops=("get",)))
    for rid in ("leader", "follower"):
        assert cache.match_prefix(TOKENS, req_id=rid).external_hit_len == 40
        assert linker.load(rid)
    follower = linker.wait_load("follower", timeout=0.05)
    cache.unlock(follower.lock)
    assert not follower.ok and follower.reason == "timeout"
    leader = finish(cache, linker, "leader")
    assert leader.ok and leader.prefix_len == 40
    linker.close()
    assert_exact(cache)


def test_a_timed_out_load_never_delays_another_loads_outcome(store) -> None:
    """#13.7: load r1's store get hangs; load r2's finishes. r1 fails at its deadline; r2 is
    ok. The old linker applied completions strictly in submission order: r2 waited behind r1
    and failed with 'timeout' although its pages had arrived."""
    offloaded("full", store)
    other = list(range(300, 340))
    cache_a = make_cache("full")
    linker_a = ExternalCacheLinker(cache_a, store)
    serve(cache_a, other)
    assert linker_a.flush(timeout=10)
    gated = GatedStore(store)
    cache = make_cache("full")
    linker = ExternalCacheLinker(cache, gated, load_timeout_s=0.5)
    gated.gated = set(_keys(linker, cache, TOKENS))  # only r1's pages hang
    assert cache.match_prefix(TOKENS, req_id="r1").external_hit_len == 40
    assert linker.load("r1")
    assert cache.match_prefix(other, req_id="r2").external_hit_len == 40 and linker.load("r2")
    r2 = linker.wait_load("r2")
    r1 = linker.wait_load("r1")
    assert r2.ok and r2.prefix_len == 40, r2.reason
    assert not r1.ok and r1.reason == "timeout"
    for out in (r1, r2):
        cache.unlock(out.lock)
    gated.open.set()
    linker.close()
    assert_exact(cache)


def _keys(linker: ExternalCacheLinker, cache: Any, tokens: list[int]) -> list[str]:
    hashes = page_hashes(tokens, PS, cache.config.namespace)
    return linker.parts.store_keys(PoolTransfer(name=PoolName.KV, keys=hashes),
                             cache.config.namespace)


def test_cancel_releases_a_queued_load_and_an_unclaimed_outcome(store) -> None:
    """#13.8: a request that goes away calls cancel(): a queued load's lock and reserved slots
    go (the reservation when the worker returns), a finished but unclaimed outcome's lock goes,
    a remembered lookup goes; a second load() of a req_id that is still loading is refused."""
    offloaded("full", store)
    cache = make_cache("full")
    linker = ExternalCacheLinker(cache, FaultyStore(store, delay_ms=200, ops=("get",)))
    assert cache.match_prefix(TOKENS, req_id="gone").external_hit_len == 40
    assert linker.load("gone")
    assert cache.match_prefix(TOKENS, req_id="gone").external_hit_len == 40
    with pytest.raises(ValueError, match="already has a load in flight"):
        linker.load("gone")
    assert linker.cancel("gone")  # the queued load and the second, remembered lookup
    assert not linker.cancel("gone")
    assert linker.flush(timeout=10)
    assert cache.stats()["held_tokens"] == 0 and cache.stats()["num_locks"] == 0
    assert cache.match_prefix(TOKENS, req_id="late").external_hit_len == 40
    assert linker.load("late")
    assert linker.flush(timeout=10)  # finished; its outcome (and lock) wait to be taken
    assert cache.stats()["num_locks"] == 1
    cache.match_prefix(TOKENS, req_id="late")
    with pytest.raises(ValueError, match="not yet taken"):
        linker.load("late")
    assert linker.cancel("late")
    assert cache.stats()["num_locks"] == 0
    linker.close()
    assert_exact(cache)


def test_remembered_lookups_are_bounded_by_bytes(store) -> None:
    """#13.8: lookups that are never loaded are dropped past ``max_lookup_bytes`` (each pins
    its tokens and keys), oldest first; the count bound alone let ~4 GB pile up."""
    offloaded("full", store)
    cache = make_cache("full")
    linker = ExternalCacheLinker(cache, store, max_lookup_bytes=2048)
    for i in range(50):
        assert cache.match_prefix(TOKENS, req_id=i).external_hit_len == 40
    stats = linker.stats()
    assert stats["lookup_bytes_remembered"] <= 2048 and stats["lookups_dropped"] > 40
    assert not linker.load(0) and linker.load(49)
    finish(cache, linker, 49)
    linker.close()
    assert_exact(cache)


# ---------------------------------------------------------------- 9. hits, roots


def test_publishing_is_not_a_hit(store) -> None:
    """#13.9: B's device prefix node has hit count h; loading the tail after it must not count
    a hit on it (it shifted write_through_selective and LFU) nor an insert call."""
    offloaded("full", store)
    cache = make_cache("full")
    linker = ExternalCacheLinker(cache, store, write_policy="write_through_selective",
                                 write_through_threshold=5)
    serve(cache, TOKENS[:20])
    node = cache.match_prefix(TOKENS[:20]).last_node
    hits, inserts = node.hit_count, cache.stats()["insert_calls"]
    assert cache.match_prefix(TOKENS, req_id="r").external_hit_len == 20 and linker.load("r")
    assert finish(cache, linker, "r").ok
    assert node.hit_count == hits and cache.stats()["insert_calls"] == inserts
    linker.close()
    assert_exact(cache)


def test_namespace_roots_go_when_their_last_node_is_evicted() -> None:
    """#13.9: 200 distinct cache_salt values (evicting each other), then evict everything: only
    the main root is left (they used to stay forever, one per salt)."""
    cache = make_cache("full")
    for i in range(200):
        ns = Namespace(cache_salt=f"user-{i}")
        kv = cache.alloc(8)
        cache.insert(InsertParams(key=list(range(8)), value=kv, namespace=ns))
    assert len(cache.tree.roots()) <= 1 + cache.stats()["num_nodes"]
    cache.evict(10**6)
    assert len(cache.tree.roots()) == 1
    cache.check_invariants()
