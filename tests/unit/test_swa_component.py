"""SWA on the tree through the facade: window matching, swa_evicted_seqlen, healing tombstones
(replace or remap), window locks across splits, eviction, accounting and config."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import ComponentType, EvictParams, InsertParams, InsertResult, PoolName
from radixlink.memory.layout import KVLayout
from radixlink.memory.pools import KVPool
from radixlink.nocache import NoPrefixCache

FULL, SWA = ComponentType.FULL, ComponentType.SWA


def make(window: int = 8, num_tokens: int = 128, swa_tokens: int = 128, **kw: Any) -> UnifiedCache:
    return UnifiedCache(CacheConfig(page_size=4, num_tokens=num_tokens, sliding_window=window,
                                    swa_num_tokens=swa_tokens, **kw))


def insert(cache: UnifiedCache, seq: list[int], *, prev: int = 0, sev: int = 0,
           kv: torch.Tensor | None = None) -> InsertResult:
    """Insert ``seq`` with fresh slots (after ``prev`` matched tokens in ``kv``), releasing the
    caller's SWA pages below ``sev`` first as an engine would."""
    if kv is None:
        new = cache.alloc(len(seq) - prev)
        assert new is not None
        kv = torch.cat([cache.match_prefix(seq).device_indices[:prev], new])
    drop = max(0, sev // 4 * 4 - prev)
    if drop:
        cache.hybrid.free_swa(kv[prev : prev + drop])
    result = cache.insert(InsertParams(key=seq, value=kv, prev_prefix_len=prev,
                                       swa_evicted_seqlen=sev, track_adopted_ranges=True))
    cache.check_invariants()
    return result


def live_tokens(cache: UnifiedCache, seq: list[int]) -> int:
    return cache.match_prefix(seq).swa_live_len


def test_alloc_maps_swa_pages_and_free_returns_both() -> None:
    """Every page from alloc has a fresh SWA page; free returns both; free_swa only the SWA."""
    cache = make(swa_tokens=32)
    slots = cache.alloc(10)
    assert slots is not None and len(slots) == 12
    swa = cache.hybrid.swa_slots(slots)
    assert bool((swa != 0).all()) and torch.unique(swa).numel() == 12
    assert cache.stats()["swa_held_tokens"] == 12
    cache.hybrid.free_swa(slots[:4])
    assert cache.stats()["swa_held_tokens"] == 8
    assert bool((cache.hybrid.swa_slots(slots[:4]) == 0).all())
    cache.free(slots)
    stats = cache.stats()
    assert stats["held_tokens"] == 0 and stats["swa_held_tokens"] == 0
    assert stats["swa_free_tokens"] == 32
    cache.check_invariants()


def test_match_returns_the_window_and_its_live_length() -> None:
    """Scenario: 20 tokens cached with every SWA page live, window 6 (2 pages): the match
    returns the last 8 SWA slots, all live run of 20, and they map the last full slots."""
    cache = make(window=6)
    seq = list(range(20))
    insert(cache, seq)
    m = cache.match_prefix(seq)
    assert m.prefix_len == 20 and m.swa_live_len == 20
    assert torch.equal(m.swa_indices, cache.hybrid.swa_slots(m.device_indices[-8:]))


@pytest.mark.parametrize(("window", "expected"), [(4, 16), (6, 0), (8, 0)])
def test_refuse_a_match_whose_window_is_partly_tombstoned(window: int, expected: int) -> None:
    """Scenario: 16 tokens inserted with swa_evicted_seqlen=12: only page [12, 16) keeps SWA.
    Window 4 fits in it: boundary 16 matches. Windows 6 and 8 reach page [8, 12), a
    tombstone: boundary 16 is refused, and so is every earlier one (their windows are dead)."""
    cache = make(window=window)
    seq = list(range(16))
    result = insert(cache, seq, sev=12)
    assert result.adopted_ranges == {FULL: [(0, 16)], SWA: [(12, 16)]}
    m = cache.match_prefix(seq + [99])
    assert m.prefix_len == expected
    assert m.swa_live_len == (4 if expected else 0)
    assert cache.stats()["swa_cached_tokens"] == 4


def test_insert_beyond_swa_evicted_seqlen() -> None:
    """Scenario: the caller drops SWA pages below 8 itself, but swa_evicted_seqlen=10 is not
    page aligned: page [8, 12) still holds tokens 8, 9 that left the window, so the insert
    frees its SWA page too and keeps SWA only for [12, 20); nothing stays held."""
    cache = make(window=4)
    seq = list(range(21))
    kv = cache.alloc(21)
    assert kv is not None
    cache.hybrid.free_swa(kv[:8])
    result = cache.insert(InsertParams(key=seq, value=kv[:20], swa_evicted_seqlen=10,
                                       track_adopted_ranges=True))
    cache.free(kv[20:])
    assert result.adopted_ranges == {FULL: [(0, 20)], SWA: [(12, 20)]}
    assert bool((cache.hybrid.swa_slots(kv[:12]) == 0).all())
    stats = cache.stats()
    assert stats["swa_held_tokens"] == 0 and stats["swa_cached_tokens"] == 8
    assert cache.match_prefix(seq).prefix_len == 20
    cache.check_invariants()


def test_a_hole_in_the_callers_swa_pages_moves_the_live_start() -> None:
    """A caller page above swa_evicted_seqlen without SWA (freed early) ends the live run:
    only the pages after it are kept."""
    cache = make(window=4)
    seq = list(range(16))
    kv = cache.alloc(16)
    assert kv is not None
    cache.hybrid.free_swa(kv[4:8])
    result = insert(cache, seq, kv=kv)
    assert result.adopted_ranges == {FULL: [(0, 16)], SWA: [(8, 16)]}
    assert cache.stats()["swa_held_tokens"] == 0


def test_heal_an_swa_tombstone_inside_the_window() -> None:
    """Scenario, unlocked node (replace):
    1. insert A (24 tokens) with swa_evicted_seqlen=16: node [0, 24) is live on [16, 24);
    2. A[:16] + junk matches nothing (window 8 at 16 needs [8, 16), a tombstone);
    3. serve A[:16] + B (8 new tokens) from prefix 0 with every SWA page live: the insert
       splits A at 16, and the front [0, 16) heals with the caller's fresh pages; it is not
       locked, so the tree takes the caller's full slots too and frees its old ones.
    Adopted: FULL [0, 24) (healed + new leaf), SWA [0, 24). Then A[:16] + junk matches 16."""
    cache = make(window=8)
    a = list(range(24))
    insert(cache, a, sev=16)
    old = cache.match_prefix(a).device_indices[:16].clone()
    assert cache.match_prefix(a[:16] + [99] * 4).prefix_len == 0
    key = a[:16] + list(range(100, 108))
    result = insert(cache, key)
    assert result.prefix_len == 16
    assert result.adopted_ranges == {FULL: [(0, 24)], SWA: [(0, 24)]}
    m = cache.match_prefix(a[:16] + [99] * 4)
    assert m.prefix_len == 16 and m.swa_live_len == 16
    assert not bool(torch.isin(m.device_indices, old).any())  # the old full slots were freed
    assert cache.match_prefix(a).prefix_len == 24
    assert cache.stats()["free_tokens"] == 128 - 32


def test_heal_of_a_locked_node_remaps_instead_of_replacing() -> None:
    """Scenario, locked node (remap): A (16 tokens) with swa_evicted_seqlen=8 is matched to 16
    (window 4 lives in [8, 16)) and locked; inserting A again with fresh slots and every SWA
    page live heals [0, 8) without touching the locked full slots: adopted SWA [0, 8) only,
    the tree's full slots now map to the caller's SWA pages, and the caller's full pages are
    freed as duplicates."""
    cache = make(window=4)
    a = list(range(16))
    insert(cache, a, sev=8)
    m = cache.match_prefix(a)
    assert m.prefix_len == 16 and m.swa_live_len == 8
    handle = cache.lock(m.last_node)
    kv = cache.alloc(16)
    assert kv is not None
    caller_swa = cache.hybrid.swa_slots(kv[:8]).clone()
    result = insert(cache, a, kv=kv)
    assert result.adopted_ranges == {SWA: [(0, 8)]}
    after = cache.match_prefix(a)
    assert torch.equal(after.device_indices, m.device_indices) and after.swa_live_len == 16
    assert torch.equal(cache.hybrid.swa_slots(after.device_indices[:8]), caller_swa)
    stats = cache.stats()
    assert stats["held_tokens"] == 0 and stats["swa_held_tokens"] == 0
    cache.unlock(handle)
    cache.check_invariants()


def test_the_tree_epoch_moves_exactly_when_tree_owned_data_is_freed() -> None:
    """#46: a match holds as long as the tree's epoch has not moved (the linker's load()
    trusts its lookup's match then): inserts that only add, splits, locks, matches and a
    remap heal of a locked node leave it; a heal that replaces an unlocked node's full slots,
    and an eviction, move it."""
    cache = make(window=4)
    epoch = cache.tree.epoch
    a = list(range(16))
    insert(cache, a, sev=8)
    insert(cache, a[:8] + [50] * 8, sev=8)  # NOTE: splits A at 8, heals nothing
    m = cache.match_prefix(a)
    handle = cache.lock(m.last_node)
    kv = cache.alloc(16)
    assert kv is not None
    assert insert(cache, a, kv=kv).adopted_ranges == {SWA: [(0, 8)]}  # remap: locked
    cache.unlock(handle)
    assert cache.tree.epoch == epoch
    b = list(range(200, 224))
    insert(cache, b, sev=16)
    insert(cache, b[:16] + list(range(300, 308)))  # NOTE: heals b[:16], unlocked: replaces
    assert cache.tree.epoch == epoch + 1
    assert cache.evict(EvictParams(num_tokens=4)).num_tokens_evicted >= 4
    assert cache.tree.epoch == epoch + 2


def test_eviction_tombstones_internal_swa_and_keeps_the_locked_window() -> None:
    """Scenario: A (16) -> A+B (16 more) -> A+B+C (16 more), window 4, the leaf locked. SWA
    eviction may take the SWA of A and A+B (internal: their full KV stays) but not the
    leaf's last window; the leaf still matches, A alone no longer does."""
    cache = make(window=4)
    a, b, c = list(range(16)), list(range(100, 116)), list(range(200, 216))
    insert(cache, a)
    insert(cache, a + b, prev=16)
    insert(cache, a + b + c, prev=32)
    m = cache.match_prefix(a + b + c)
    handle = cache.lock(m.last_node)
    result = cache.evict(EvictParams(swa_num_tokens=48))
    assert result.swa_num_tokens_evicted == 32 and result.num_tokens_evicted == 0
    assert cache.stats()["cached_tokens"] == 48
    assert cache.match_prefix(a + b + c).prefix_len == 48
    assert cache.match_prefix(a + [7]).prefix_len == 0
    cache.unlock(handle)
    cache.check_invariants()
    assert cache.evict(EvictParams(swa_num_tokens=4)).num_tokens_evicted == 48  # leaf goes whole
    assert cache.stats()["num_nodes"] == 0
    cache.check_invariants()


def test_lock_protects_only_the_last_window_and_survives_a_split() -> None:
    """Scenario: window 8 over pages of 4; A (32 tokens) locked at its only node. A split at 16
    (insert A[:16] + X) moves the node's front into a new parent; the front inherits the lock
    (its tokens 12..16 are in the window). Unlock with the same receipt leaves no lock."""
    cache = make(window=8)
    a = list(range(32))
    insert(cache, a)
    handle = cache.lock(cache.match_prefix(a).last_node)
    insert(cache, a[:16] + list(range(50, 58)), prev=16,
           kv=torch.cat([cache.match_prefix(a).device_indices[:16], cache.alloc(8)]))
    cache.check_invariants()
    freed = cache.evict(EvictParams(swa_num_tokens=64)).swa_num_tokens_evicted
    assert freed == 8  # only the new leaf: A's front and back stay locked
    cache.unlock(handle)
    cache.check_invariants()
    assert cache.stats()["swa_evictable_nodes"] == 2


def test_alloc_evicts_swa_when_the_swa_pool_is_short() -> None:
    """With a small SWA pool, alloc evicts cached SWA (LRU leaves whole) to map new pages, and
    returns None, allocating nothing, when locked data holds the pool."""
    cache = make(window=4, swa_tokens=16)
    insert(cache, list(range(16)))
    slots = cache.alloc(8)
    assert slots is not None and cache.stats()["num_nodes"] == 0
    cache.free(slots)
    insert(cache, list(range(16)))
    handle = cache.lock(cache.match_prefix(list(range(16))).last_node)
    before = cache.stats()
    assert cache.alloc(8) is None
    assert cache.stats()["held_tokens"] == before["held_tokens"] == 0
    cache.unlock(handle)
    cache.check_invariants()


def test_swa_misuse_raises() -> None:
    """free_swa of tree slots, SWA calls on a FULL cache and eviction targets for a missing
    pool raise ValueError naming the problem."""
    cache = make()
    insert(cache, list(range(8)))
    owned = cache.match_prefix(list(range(8))).device_indices
    with pytest.raises(ValueError, match="tree owns"):
        cache.hybrid.free_swa(owned)
    with pytest.raises(ValueError, match="tree owns"):
        cache.free(owned)
    full_only = UnifiedCache(CacheConfig(page_size=4, num_tokens=32))
    with pytest.raises(ValueError, match="no SWA component"):
        full_only.hybrid.swa_slots(owned)
    with pytest.raises(ValueError, match="no SWA"):
        full_only.evict(EvictParams(swa_num_tokens=4))
    cache.check_invariants()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"swa_num_tokens": 16}, "needs sliding_window"),
        ({"sliding_window": 0}, "sliding_window"),
        ({"sliding_window": 4, "swa_num_tokens": 10}, "multiple"),
        ({"sliding_window": 4, "swa_layout": "x"}, "KVLayout"),
        ({"mamba_num_states": 0}, "mamba_num_states"),
    ],
)
def test_hybrid_config_validation(kwargs: dict[str, Any], message: str) -> None:
    """CacheConfig rejects bad SWA and Mamba settings with a ValueError naming the field."""
    with pytest.raises(ValueError, match=message):
        CacheConfig(page_size=4, num_tokens=32, **kwargs)


def test_swa_pool_and_no_prefix_cache() -> None:
    """pool(SWA) is a KVPool over the SWA allocator; NoPrefixCache keeps the SWA contract."""
    layout = KVLayout(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float16, page_size=4)
    cache = make(swa_tokens=16, swa_layout=layout)
    pool = cache.pool(PoolName.SWA)
    assert isinstance(pool, KVPool) and pool.num_slots == 20 and cache.pool("mamba") is None
    nocache = NoPrefixCache(CacheConfig(page_size=4, num_tokens=32, sliding_window=4,
                                        swa_num_tokens=16))
    kv = nocache.alloc(10)
    assert kv is not None and bool((nocache.hybrid.swa_slots(kv) != 0).all())
    nocache.hybrid.free_swa(kv[:4])
    nocache.insert(InsertParams(key=list(range(10)), value=kv[:8]))
    nocache.free(kv[8:])
    nocache.check_invariants()
    assert nocache.stats()["swa_free_tokens"] == 16 and nocache.stats()["free_tokens"] == 32
