"""Mamba states on the tree through the facade: boundaries only at stated node ends, copy-on-write
matches, splits, duplicates, locks, eviction order, slot ownership and NoPrefixCache."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import ComponentType, EvictParams, InsertParams, InsertResult
from radixlink.memory.layout import StateLayout
from radixlink.memory.pools import MambaStatePool
from radixlink.nocache import NoPrefixCache

FULL, SWA, MAMBA = ComponentType.FULL, ComponentType.SWA, ComponentType.MAMBA
LAYOUT = StateLayout(shapes=((2, 3), (4,)), dtype=torch.float32)


def make(num_states: int = 8, **kw: Any) -> UnifiedCache:
    return UnifiedCache(CacheConfig(page_size=4, num_tokens=128, mamba_num_states=num_states,
                                    state_layout=LAYOUT, **kw))


def states(cache: UnifiedCache) -> MambaStatePool:
    pool = cache.pool("mamba")
    assert isinstance(pool, MambaStatePool)
    return pool


def insert(cache: UnifiedCache, seq: list[int], value: float | None, prev: int = 0) -> InsertResult:
    """Insert ``seq`` (whole pages) with a state filled with ``value`` (None: no state)."""
    m = cache.match_prefix(seq[:prev]) if prev else None
    new = cache.alloc(len(seq) - prev)
    assert new is not None
    kv = new if m is None else torch.cat([m.device_indices, new])
    slot = None
    if value is not None:
        slot = cache.hybrid.alloc_state()
        assert slot is not None
        for i in range(states(cache).num_tensors):
            states(cache).tensors(i)[slot] = value
    result = cache.insert(InsertParams(key=seq, value=kv, prev_prefix_len=prev, mamba_value=slot,
                                       track_adopted_ranges=True))
    cache.check_invariants()
    return result


def test_copy_on_write_leaves_the_trees_state_untouched() -> None:
    """Scenario:
    1. insert A (16 tokens) with a state of 1.0: the tree adopts it (MAMBA range [12, 16));
    2. match A: mamba_slot is the tree's slot and nothing is allocated (match is read-only);
    3. lock and copy_state: a fresh request-held slot holding 1.0 in every tensor;
    4. the request writes 7.0 into its copy (as decoding would);
    5. a second copy holds 1.0 again: the tree's state was never written."""
    cache = make()
    result = insert(cache, list(range(16)), 1.0)
    assert result.adopted_ranges == {FULL: [(0, 16)], MAMBA: [(12, 16)]}
    tree_slot = result.last_node.values[1]
    m = cache.match_prefix(list(range(16)) + [99])
    assert m.prefix_len == 16 and m.mamba_slot == tree_slot
    assert cache.stats()["mamba_held_states"] == 0
    handle = cache.lock(m.last_node)
    mine = cache.hybrid.copy_state(m.last_node)
    assert mine not in (None, tree_slot)
    pool = states(cache)
    for i in range(pool.num_tensors):
        assert bool((pool.tensors(i)[mine] == 1.0).all())
        pool.tensors(i)[mine] = 7.0
    again = cache.hybrid.copy_state(cache.match_prefix(list(range(16))).last_node)
    assert again not in (None, mine, tree_slot)
    for i in range(pool.num_tensors):
        assert bool((pool.tensors(i)[again] == 1.0).all())
        assert bool((pool.tensors(i)[tree_slot] == 1.0).all())
    assert cache.stats()["mamba_held_states"] == 2
    cache.hybrid.free_state(mine)
    cache.hybrid.free_state(again)
    cache.unlock(handle)
    cache.check_invariants()


def test_only_node_ends_with_a_state_match_and_a_split_gives_none() -> None:
    """Scenario: A (16, state) then A[:8] + X (16, state) splits A at 8; the new front [0, 8)
    has no state, so A[:8] + junk matches nothing although its full KV is cached, while A and
    A[:8] + X match to their stated ends."""
    cache = make()
    a = list(range(16))
    insert(cache, a, 1.0)
    b = a[:8] + list(range(50, 58))
    insert(cache, b, 2.0, prev=0)
    assert cache.stats()["num_nodes"] == 3 and cache.stats()["mamba_cached_states"] == 2
    assert cache.match_prefix(a[:8] + [5] * 4).prefix_len == 0
    for seq in (a, b):
        m = cache.match_prefix(seq)
        assert m.prefix_len == 16 and m.mamba_slot == m.last_node.values[1]
    assert cache.match_prefix(a[:12]).mamba_slot is None  # empty match: no state


def test_a_duplicate_state_is_freed() -> None:
    """A second insert of the same key with its own state: the tree keeps the first, frees the
    caller's (no MAMBA range), and nothing stays held."""
    cache = make()
    first = insert(cache, list(range(8)), 1.0)
    second = insert(cache, list(range(8)), 2.0)
    assert second.adopted_ranges == {}
    assert second.last_node.values[1] == first.last_node.values[1]
    stats = cache.stats()
    assert stats["mamba_cached_states"] == 1 and stats["mamba_held_states"] == 0
    assert stats["mamba_free_states"] == 7


def test_eviction_goes_leaf_first_and_drops_internal_states() -> None:
    """Scenario: A (state) -> A+B (state) -> A+B+C (state, leaf), all matched together.
    1. evicting one state takes the leaf A+B+C whole (deepest first among equals);
    2. with A+B locked, a second takes A's state only: A is internal, its full KV stays and
       A+B still matches; A alone does not;
    3. after unlocking, evicting A+B's state removes A+B, and then A (a leaf without a state)
       goes too."""
    cache = make()
    a, b, c = list(range(8)), list(range(100, 108)), list(range(200, 208))
    insert(cache, a, 1.0)
    insert(cache, a + b, 2.0, prev=8)
    insert(cache, a + b + c, 3.0, prev=16)
    first = cache.evict(EvictParams(mamba_num=1))
    assert first.mamba_num_evicted == 1 and first.num_tokens_evicted == 8
    m = cache.match_prefix(a + b)
    handle = cache.lock(m.last_node)
    second = cache.evict(EvictParams(mamba_num=1))
    assert second.mamba_num_evicted == 1 and second.num_tokens_evicted == 0
    assert cache.match_prefix(a + [9] * 4).prefix_len == 0
    m = cache.match_prefix(a + b)
    assert m.prefix_len == 16
    cache.unlock(handle)
    third = cache.evict(EvictParams(mamba_num=1))
    assert third.num_tokens_evicted == 16 and cache.stats()["num_nodes"] == 0
    cache.check_invariants()


def test_state_slots_are_evicted_for_requests_and_locks_protect_them() -> None:
    """With 2 state slots both cached, a copy evicts the other (unlocked) state; when the only
    other cached state is locked and one slot is held, alloc_state and copy_state return None,
    and match never evicts or allocates at all."""
    cache = make(num_states=2)
    insert(cache, list(range(8)), 1.0)
    insert(cache, list(range(50, 58)), 2.0)
    m = cache.match_prefix(list(range(8)))
    assert m.prefix_len == 8 and cache.stats()["mamba_cached_states"] == 2  # read-only
    handle = cache.lock(m.last_node)
    mine = cache.hybrid.copy_state(m.last_node)  # needs a slot: evicts the other state
    assert mine is not None and cache.stats()["mamba_cached_states"] == 1
    assert cache.hybrid.alloc_state() is None and cache.hybrid.copy_state(m.last_node) is None
    again = cache.match_prefix(list(range(8)))
    assert again.prefix_len == 8 and again.mamba_slot == m.mamba_slot
    cache.hybrid.free_state(mine)
    cache.unlock(handle)
    cache.check_invariants()


def test_match_never_evicts_another_prompt_on_a_full_state_pool() -> None:
    """Regression (#13, item 2): with every state slot cached, a plain match of prompt A used
    to copy A's state and evict B's leaf (full KV included) to make room; now the match
    changes nothing but recency: B still matches and no eviction is counted."""
    cache = make(num_states=2)
    a, b = list(range(8)), list(range(50, 58))
    insert(cache, a, 1.0)
    insert(cache, b, 2.0)
    before = cache.stats()
    assert cache.match_prefix(a).prefix_len == 8
    after = cache.stats()
    assert cache.match_prefix(b).prefix_len == 8
    for key in ("num_nodes", "cached_tokens", "mamba_cached_states", "mamba_held_states",
                "evicted_tokens", "mamba_evicted_states", "free_tokens"):
        assert after[key] == before[key], key
    cache.check_invariants()


def test_evicted_counters_count_cascades_of_every_component() -> None:
    """Regression (#13, item 2): a MAMBA eviction that removes a leaf frees its full tokens
    too; ``evicted_tokens`` counts them (it used to count FULL's own evictions only)."""
    cache = make(num_states=2)
    insert(cache, list(range(8)), 1.0)
    freed = cache.evict(EvictParams(mamba_num=1))
    assert freed.mamba_num_evicted == 1 and freed.num_tokens_evicted == 8
    stats = cache.stats()
    assert stats["evicted_tokens"] == 8 and stats["mamba_evicted_states"] == 1


def test_mamba_misuse_raises() -> None:
    """Tree-owned or free slots, states with a partial page, and state calls on a cache
    without MAMBA raise ValueError; nothing changes."""
    cache = make()
    result = insert(cache, list(range(8)), 1.0)
    tree_slot = result.last_node.values[1]
    with pytest.raises(ValueError, match="belongs to the tree"):
        cache.hybrid.free_state(tree_slot)
    held = cache.hybrid.alloc_state()
    kv = cache.alloc(10)
    assert held is not None and kv is not None
    with pytest.raises(ValueError, match="whole pages"):
        cache.insert(InsertParams(key=list(range(10)), value=kv[:10], mamba_value=held))
    with pytest.raises(ValueError, match="belongs to the tree"):
        cache.insert(InsertParams(key=list(range(8)), value=kv[:8], mamba_value=tree_slot))
    cache.hybrid.free_state(held)
    with pytest.raises(ValueError, match="not allocated"):
        cache.hybrid.free_state(held)
    with pytest.raises(ValueError, match="no MAMBA"):
        UnifiedCache(CacheConfig(page_size=4, num_tokens=32)).hybrid.alloc_state()
    cache.free(kv)
    cache.check_invariants()


def test_full_swa_mamba_together() -> None:
    """All three components: a match needs a stated node end whose window is live; without
    layouts the state slots are indices only (pool None)."""
    cache = UnifiedCache(CacheConfig(page_size=4, num_tokens=64, sliding_window=4,
                                     mamba_num_states=4))
    assert cache.pool("mamba") is None
    kv = cache.alloc(16)
    state = cache.hybrid.alloc_state()
    assert kv is not None and state is not None
    cache.hybrid.free_swa(kv[:12])
    result = cache.insert(InsertParams(key=list(range(16)), value=kv, swa_evicted_seqlen=12,
                                       mamba_value=state, track_adopted_ranges=True))
    assert result.adopted_ranges == {FULL: [(0, 16)], SWA: [(12, 16)], MAMBA: [(12, 16)]}
    m = cache.match_prefix(list(range(16)))
    assert m.prefix_len == 16 and m.swa_live_len == 4 and m.mamba_slot == state
    cache.check_invariants()
    assert [c.component_type for c in cache.components] == [FULL, SWA, MAMBA]


def test_no_prefix_cache_frees_the_state() -> None:
    """NoPrefixCache hands out and takes back state slots; insert frees mamba_value."""
    cache = NoPrefixCache(CacheConfig(page_size=4, num_tokens=32, mamba_num_states=2))
    slot = cache.hybrid.alloc_state()
    kv = cache.alloc(8)
    assert slot is not None and kv is not None
    cache.insert(InsertParams(key=list(range(8)), value=kv, mamba_value=slot))
    cache.check_invariants()
    assert cache.stats()["mamba_free_states"] == 2 and cache.stats()["free_tokens"] == 32
