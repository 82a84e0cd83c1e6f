"""UnifiedCache facade: the request protocol, slot ownership, misuse, config and NoPrefixCache."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import serving
import torch

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig, EvictionPolicy
from radixlink.contract import ComponentType, InsertParams, InsertResult, PoolName
from radixlink.hashing import Namespace
from radixlink.memory.layout import KVLayout
from radixlink.memory.pools import KVPool
from radixlink.nocache import NoPrefixCache

FULL = ComponentType.FULL
LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=4, dtype=torch.float32, page_size=4)


def make(page_size: int = 4, num_tokens: int = 64, **kw: Any) -> UnifiedCache:
    return UnifiedCache(CacheConfig(page_size=page_size, num_tokens=num_tokens, **kw))


def serve(cache: UnifiedCache, seq: list[int], **kw: Any) -> InsertResult:
    """One request by the documented protocol (tests/serving.py), then the invariants."""
    result = serving.serve(cache, seq, check=True, **kw).insert
    assert result is not None
    return result


def snapshot(cache: UnifiedCache) -> dict[str, Any]:
    stats = cache.stats()
    return {k: stats[k] for k in ("cached_tokens", "held_tokens", "free_tokens", "num_nodes")}


def test_empty_cache_matches_nothing_and_root_lock_is_a_noop() -> None:
    """An empty match ends at the root; its lock is a receipt that protects nothing."""
    cache = make()
    m = cache.match_prefix([1, 2, 3, 4, 5])
    assert m.prefix_len == 0 and m.device_indices.numel() == 0 and m.node_offset == 0
    handle = cache.lock(m.last_node)
    assert cache.stats()["protected_tokens"] == 0
    cache.unlock(handle)
    with pytest.raises(ValueError, match="already released"):
        cache.unlock(handle)
    cache.check_invariants()


def test_request_protocol_caches_whole_pages_and_returns_slots() -> None:
    """Scenario: serve 18 tokens (page 4) -> 16 cached, the tail page freed by the caller;
    a second match returns the same slots the insert took, and nothing is held."""
    cache = make()
    seq = list(range(100, 118))
    result = serve(cache, seq, track_adopted_ranges=True)
    assert result.prefix_len == 0 and result.adopted_ranges == {FULL: [(0, 16)]}
    m = cache.match_prefix(seq)
    assert m.prefix_len == 16 and m.last_node is result.last_node
    assert m.node_offset == 16 and len(m.device_indices) == 16
    assert snapshot(cache) == {
        "cached_tokens": 16,
        "held_tokens": 0,
        "free_tokens": 48,
        "num_nodes": 1,
    }


@pytest.mark.parametrize("kind", ["list", "numpy", "tensor"])
def test_tokens_may_be_list_array_or_tensor(kind: str) -> None:
    """A prefix inserted as a list matches when queried as a numpy array or tensor."""
    cache = make()
    seq = list(range(20))
    serve(cache, seq)
    query: Any = {"list": seq, "numpy": np.array(seq), "tensor": torch.tensor(seq)}[kind]
    assert cache.match_prefix(query).prefix_len == 20


def test_match_inside_a_node_is_read_only() -> None:
    """A match ending mid-node reports the offset and does not split the node."""
    cache = make()
    serve(cache, list(range(16)))
    m = cache.match_prefix(list(range(9)) + [99])
    assert m.prefix_len == 8 and m.node_offset == 8 and m.last_node.num_tokens == 16
    assert cache.stats()["num_nodes"] == 1
    cache.check_invariants()


def test_divergent_insert_splits_and_adopts_only_new_pages() -> None:
    """Scenario: cache A = t0..t15; serve B = t0..t7 + 8 new tokens with prev = 8:
    the node splits at 8, B's new pages become a leaf, [8, 16) is adopted."""
    cache = make()
    a = list(range(16))
    serve(cache, a)
    b = a[:8] + [50 + i for i in range(8)]
    result = serve(cache, b, track_adopted_ranges=True)
    assert result.prefix_len == 8 and result.adopted_ranges == {FULL: [(8, 16)]}
    assert cache.stats()["num_nodes"] == 3
    assert cache.match_prefix(a).prefix_len == 16 and cache.match_prefix(b).prefix_len == 16


def test_duplicate_insert_frees_the_callers_copy() -> None:
    """Inserting cached pages again (prev = 0) frees the caller's duplicates inside insert."""
    cache = make()
    seq = list(range(12))
    serve(cache, seq)
    fresh = cache.alloc(12)
    assert fresh is not None
    result = cache.insert(InsertParams(key=seq, value=fresh, track_adopted_ranges=True))
    assert result.prefix_len == 12 and result.adopted_ranges == {}
    assert snapshot(cache)["held_tokens"] == 0 and snapshot(cache)["cached_tokens"] == 12
    cache.check_invariants()


def test_insert_ending_inside_a_node_splits_there() -> None:
    """A key that ends mid-node splits it so ``last_node`` ends exactly at the key's end."""
    cache = make()
    serve(cache, list(range(16)))
    fresh = cache.alloc(8)
    assert fresh is not None
    result = cache.insert(InsertParams(key=list(range(8)), value=fresh))
    assert result.last_node.seq_len == 8 and cache.stats()["num_nodes"] == 2
    cache.check_invariants()


def test_alloc_evicts_least_recently_used_leaves() -> None:
    """Scenario (capacity 4 pages of 4): cache A, B; touch A; allocating 8 tokens evicts B."""
    cache = make(num_tokens=16)
    a, b = [1] * 8, [2] * 8
    serve(cache, a)
    serve(cache, b)
    cache.match_prefix(a)
    slots = cache.alloc(8)
    assert slots is not None
    assert cache.match_prefix(a).prefix_len == 8 and cache.match_prefix(b).prefix_len == 0
    cache.free(slots)
    cache.check_invariants()


def test_lfu_keeps_the_most_hit_prefix() -> None:
    """With LFU, a prefix hit by more inserts survives a more recent, never-hit one."""
    cache = make(num_tokens=16, eviction_policy="lfu")
    hot, cold = [1] * 8, [2] * 8
    serve(cache, hot)
    serve(cache, hot)
    serve(cache, cold)
    assert cache.evict(8) == 8
    assert cache.match_prefix(hot).prefix_len == 8 and cache.match_prefix(cold).prefix_len == 0


def test_locked_prefixes_survive_eviction() -> None:
    """evict never frees locked paths; alloc returns None when only locked data is left."""
    cache = make(num_tokens=16)
    seq = list(range(16))
    serve(cache, seq)
    handle = cache.lock(cache.match_prefix(seq).last_node)
    assert cache.evict(16) == 0 and cache.alloc(4) is None
    assert cache.stats()["protected_tokens"] == 16
    cache.unlock(handle)
    assert cache.evict(1) == 16 and cache.stats()["cached_tokens"] == 0
    cache.check_invariants()


def test_eviction_goes_leaves_first() -> None:
    """A parent is evicted only after its children: its pages stay matchable until then."""
    cache = make(num_tokens=32)
    serve(cache, [1] * 8)
    serve(cache, [1] * 8 + [2] * 8)
    serve(cache, [1] * 8 + [3] * 8)
    assert cache.evict(4) == 8  # one whole leaf
    assert cache.match_prefix([1] * 8).prefix_len == 8
    assert cache.evict(8) == 8
    assert cache.match_prefix([1] * 8).prefix_len == 8
    assert cache.evict(1) == 8 and cache.stats()["num_nodes"] == 0
    cache.check_invariants()


def _misuse_cases(cache: UnifiedCache) -> list[tuple[str, Any]]:
    seq = list(range(16))
    serve(cache, seq)
    m = cache.match_prefix(seq)
    held = cache.alloc(8)
    assert held is not None
    stale = cache.lock(m.last_node)
    cache.unlock(stale)
    other = make()
    return [
        ("key only", lambda: cache.insert(InsertParams(key=[1, 2], value=held))),
        (
            "multiple of page_size",
            lambda: cache.insert(InsertParams(key=list(range(8)), value=held, prev_prefix_len=2)),
        ),
        (
            "holds only",
            lambda: cache.insert(InsertParams(
                key=[7] * 8, value=torch.cat([m.device_indices[:4], held[:4]]),
                prev_prefix_len=4)),
        ),
        ("belongs to the tree",
         lambda: cache.insert(InsertParams(key=seq, value=m.device_indices))),
        ("tree owns", lambda: cache.free(m.device_indices[:4])),
        ("already released", lambda: cache.unlock(stale)),
        ("not a lock handle", lambda: cache.unlock(other.lock(other.match_prefix([]).last_node))),
        ("another cache", lambda: other.lock(m.last_node)),
        ("InsertParams", lambda: cache.insert({"key": seq})),  # type: ignore[arg-type]
        ("int64", lambda: cache.free(held.to(torch.int32))),
        ("non-negative", lambda: cache.evict(-1)),
        ("mamba_value", lambda: cache.insert(InsertParams(key=seq, value=held, mamba_value=3))),
    ]


@pytest.mark.parametrize("case", range(12))
def test_misuse_raises_and_leaves_the_cache_unchanged(case: int) -> None:
    """Each misuse raises ValueError naming the problem; stats and invariants are unchanged."""
    cache = make()
    name, call = _misuse_cases(cache)[case]
    before = snapshot(cache)
    with pytest.raises(ValueError, match=name):
        call()
    assert snapshot(cache) == before
    cache.check_invariants()


def test_lock_of_an_evicted_node_raises() -> None:
    """A node evicted between match and lock cannot be locked (match again)."""
    cache = make()
    seq = list(range(8))
    serve(cache, seq)
    node = cache.match_prefix(seq).last_node
    cache.evict(8)
    with pytest.raises(ValueError, match="evicted"):
        cache.lock(node)


def test_namespaces_never_share_prefixes() -> None:
    """The same tokens under two namespaces are two cache entries."""
    cache = make()
    tenant = Namespace(model="m", extra_key="tenant-a")
    seq = list(range(8))
    serve(cache, seq)
    assert cache.match_prefix(seq, namespace=tenant).prefix_len == 0
    fresh = cache.alloc(8)
    assert fresh is not None
    result = cache.insert(InsertParams(key=seq, value=fresh, namespace=tenant))
    assert result.prefix_len == 0
    assert cache.match_prefix(seq, namespace=tenant).prefix_len == 8
    assert cache.stats()["cached_tokens"] == 16
    cache.check_invariants()


def test_pool_and_layout() -> None:
    """pool(KV) is None without a layout and a KVPool sized to the allocator with one."""
    assert make().pool(PoolName.KV) is None
    layout = KVLayout(num_layers=2, num_kv_heads=1, head_dim=4, dtype=torch.float16, page_size=4)
    cache = make(kv_layout=layout)
    pool = cache.pool("kv")
    assert isinstance(pool, KVPool) and cache.pool(PoolName.SWA) is None
    with pytest.raises(ValueError, match="unknown pool"):
        cache.pool("nope")


def test_attach_linker_needs_hashing_and_layouts() -> None:
    """attach_linker refuses a cache built without enable_external_cache_linker, and one whose
    pool has no tensors (no layout: nothing a linker could move), naming the setting."""
    with pytest.raises(ValueError, match="enable_external_cache_linker"):
        make().attach_linker(object())
    with pytest.raises(ValueError, match="kv_layout"):
        make(enable_external_cache_linker=True).attach_linker(object())
    with pytest.raises(ValueError, match="state_layout"):
        make(enable_external_cache_linker=True, kv_layout=LAYOUT,
             mamba_num_states=4).attach_linker(object())
    cache = make(enable_external_cache_linker=True, kv_layout=LAYOUT)
    linker = _Hooks()
    cache.attach_linker(linker)
    assert cache.linker is linker
    with pytest.raises(ValueError, match="already attached"):
        cache.attach_linker(_Hooks())


class _Hooks:
    """The hooks the cache calls on a linker, doing nothing."""

    def lookup(self, *args: Any) -> None: ...

    def on_insert(self, *args: Any) -> None: ...

    def before_evict(self, node: Any) -> None: ...


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"page_size": 0, "num_tokens": 8}, "page_size"),
        ({"page_size": 4, "num_tokens": 10}, "multiple"),
        ({"page_size": 4, "num_tokens": 8, "eviction_policy": "fifo"}, "lru"),
        ({"page_size": 4, "num_tokens": 8, "hash_algo": "md5"}, "hash_algo"),
        ({"page_size": 4, "num_tokens": 8, "namespace": "x"}, "Namespace"),
        ({"page_size": 4, "num_tokens": 8, "device": "nowhere"}, "device"),
    ],
)
def test_config_validation(kwargs: dict[str, Any], message: str) -> None:
    """CacheConfig rejects bad sizes and modes with a ValueError naming the field."""
    with pytest.raises(ValueError, match=message):
        CacheConfig(**kwargs)


def test_config_normalises_policy() -> None:
    """The policy string becomes the enum; the config is frozen."""
    config = CacheConfig(page_size=4, num_tokens=8, eviction_policy="lfu")
    assert config.eviction_policy is EvictionPolicy.LFU
    with pytest.raises(AttributeError):
        config.page_size = 8  # type: ignore[misc]


def test_no_prefix_cache_keeps_the_contract() -> None:
    """Scenario: NoPrefixCache never matches, insert frees the pages, accounting stays exact."""
    cache = NoPrefixCache(CacheConfig(page_size=4, num_tokens=32))
    seq = list(range(10))
    for _ in range(2):
        m = cache.match_prefix(seq)
        assert m.prefix_len == 0
        handle = cache.lock(m.last_node)
        kv = cache.alloc(len(seq))
        assert kv is not None
        result = cache.insert(InsertParams(key=seq, value=kv[:8]))
        assert result.prefix_len == 0
        cache.free(kv[8:])
        cache.unlock(handle)
        cache.check_invariants()
        assert cache.stats()["free_tokens"] == 32
    with pytest.raises(ValueError, match="already released"):
        cache.unlock(handle)
    with pytest.raises(ValueError, match="never matches"):
        cache.insert(InsertParams(key=seq, value=kv[:8], prev_prefix_len=4))
    assert cache.evict(100) == 0 and cache.pool(PoolName.KV) is None
    with pytest.raises(ValueError):
        cache.attach_linker(object())
