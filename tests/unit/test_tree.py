"""Tree core: split bookkeeping, hashes, hit counts, the offload chain and FULL unevict."""

from __future__ import annotations

from typing import Any

import pytest
import serving
import torch

from radixlink.cache import UnifiedCache
from radixlink.components.full import FullComponent
from radixlink.config import CacheConfig
from radixlink.contract import ComponentType, InsertParams, InsertResult
from radixlink.hashing import Namespace, page_hashes
from radixlink.memory.layout import KVLayout
from radixlink.tree.node import Effects, TreeNode

FULL = ComponentType.FULL
LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=4, dtype=torch.float32, page_size=4)


def make(page_size: int = 4, num_tokens: int = 64, **kw: Any) -> UnifiedCache:
    return UnifiedCache(CacheConfig(page_size=page_size, num_tokens=num_tokens, **kw))


def serve(cache: UnifiedCache, seq: list[int], check: bool = True, **kw: Any) -> InsertResult:
    result = serving.serve(cache, seq, check=check, **kw).insert
    assert result is not None
    return result


def test_split_keeps_locks_hits_marks_and_hashes_on_both_parts() -> None:
    """Scenario: node N = 16 tokens, locked, hit once, stored, offload in flight; an insert
    diverging at 8 splits N into P (front) + N (back): both keep the marks and hit count, P
    holds N's lock count, hashes divide 2 + 2, and the old handle still unlocks cleanly."""
    cache = make(enable_external_cache_linker=True)
    seq = list(range(16))
    serve(cache, seq)
    serve(cache, seq)  # one non-chunked overlap: hit_count 1
    node = cache.match_prefix(seq).last_node
    hashes = list(node.hash_value)
    node.external_cache_stored, node.stored_at, node.offload_inflight = True, 12.5, 7
    handle = cache.lock(node)
    serve(cache, seq[:8] + [90] * 8)
    front = node.parent
    assert front is not None and front.parent is cache.tree.root
    assert front.num_tokens == 8 and node.num_tokens == 8
    assert front.lock_refs == node.lock_refs == [1]
    assert front.hit_count == 2 and node.hit_count == 1  # the split-off front was hit again
    for part in (front, node):
        assert part.external_cache_stored and part.stored_at == 12.5
        assert part.offload_inflight == 7
    assert front.hash_value == hashes[:2] and node.hash_value == hashes[2:]
    cache.unlock(handle)
    assert front.lock_refs == node.lock_refs == [0]
    cache.check_invariants()


def test_hashes_chain_from_the_namespace_seed() -> None:
    """With hashing on, node hashes equal page_hashes of the whole key, per namespace."""
    ns = Namespace(model="m1")
    cache = make(enable_external_cache_linker=True, namespace=ns)
    seq = list(range(12))
    last = serve(cache, seq).last_node
    assert last.hash_value == page_hashes(seq, 4, ns)
    other = Namespace(model="m1", extra_key="lora-2")
    fresh = cache.alloc(12)
    assert fresh is not None
    leaf = cache.insert(InsertParams(key=seq, value=fresh, namespace=other)).last_node
    assert leaf.hash_value == page_hashes(seq, 4, other) != last.hash_value
    cache.check_invariants()


def test_no_hashes_without_the_linker_flag() -> None:
    """Hashing is off by default: nodes carry no hash_value."""
    cache = make()
    assert serve(cache, list(range(8))).last_node.hash_value is None


def test_hit_counts_come_from_non_chunked_inserts_only() -> None:
    """match never counts a hit; an overlapping insert does, unless it is chunked."""
    cache = make()
    seq = list(range(8))
    node = serve(cache, seq).last_node
    cache.match_prefix(seq)
    assert node.hit_count == 0
    serve(cache, seq, chunked=True)
    assert node.hit_count == 0
    serve(cache, seq)
    assert node.hit_count == 1


class RecordingLinker:
    """Records the calls the cache makes into an attached linker."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def lookup(self, result: Any, key: bytes, req_id: Any, namespace: Any) -> None:
        self.calls.append(("lookup", (result.prefix_len, len(key) // 4, req_id, namespace)))
        result.external_hit_len = 4

    def on_insert(self, params: InsertParams, result: InsertResult) -> None:
        self.calls.append(("on_insert", (params.prev_prefix_len, result.last_node.seq_len)))

    def before_evict(self, node: Any) -> None:
        self.calls.append(("before_evict", node.values[0].tolist()))


def test_linker_hooks_are_called_while_attached() -> None:
    """Scenario: attach a linker; match with a req_id -> lookup (its external_hit_len kept);
    match without one -> no lookup; insert -> on_insert; evict -> before_evict sees the
    node's slots still there; after detach nothing is called."""
    cache = make(enable_external_cache_linker=True, kv_layout=LAYOUT)
    linker = RecordingLinker()
    cache.attach_linker(linker)
    seq = list(range(10))
    assert cache.match_prefix(seq, req_id="r1").external_hit_len == 4
    assert cache.match_prefix(seq).external_hit_len == 0
    node = serve(cache, seq).last_node
    slots = node.values[0].tolist()
    cache.evict(8)
    assert [name for name, _ in linker.calls] == ["lookup", "on_insert", "before_evict"]
    assert linker.calls[0][1] == (0, 10, "r1", None)
    assert linker.calls[1][1] == (0, 8) and linker.calls[2][1] == slots
    with pytest.raises(ValueError, match="not the linker"):
        cache.detach_linker(RecordingLinker())
    cache.detach_linker(linker)
    serve(cache, seq)
    cache.match_prefix(seq, req_id="r2")
    cache.evict(8)
    assert len(linker.calls) == 3


def test_backup_chain_stops_at_stored_or_inflight_ancestors() -> None:
    """Scenario: path A(8) -> B(8) -> C(8). Nothing stored: chain [A, B, C]; A stored:
    [B, C]; B in flight: [C]; C itself stored: []. (Marks are views on the tree's stored
    index, by page hash: the tree hashes its pages.)"""
    cache = make(enable_external_cache_linker=True)
    serve(cache, [1] * 8)
    serve(cache, [1] * 16)
    c = serve(cache, [1] * 24).last_node
    b = c.parent
    assert b is not None and b.parent is not None
    a = b.parent
    assert cache.tree.backup_chain(c) == [a, b, c]
    a.external_cache_stored = True
    assert cache.tree.backup_chain(c) == [b, c]
    b.offload_inflight = 3
    assert cache.tree.backup_chain(c) == [c]
    c.external_cache_stored = True
    assert cache.tree.backup_chain(c) == []
    assert cache.tree.backup_chain(cache.tree.root) == []


def _tombstone(cache: UnifiedCache, node: TreeNode) -> None:
    full = cache.components[0]
    assert isinstance(full, FullComponent)
    effects = Effects(len(cache.components))
    assert node.lock_refs[0] == 0, f"tombstone of locked {node}"
    cache.tree.tombstone(node, 0, effects)  # every other component's data there goes too
    full.apply(effects)


def test_full_tombstone_stops_match_and_insert_unevicts_it() -> None:
    """Scenario: A(8) -> B(8); A's full data is dropped (a tombstone, B stays): match stops at
    0; re-serving the sequence adopts fresh slots into A (range [0, 8)) and duplicates B's."""
    cache = make()
    seq = [5] * 8 + [6] * 8
    serve(cache, [5] * 8)
    b = serve(cache, seq).last_node
    a = b.parent
    assert a is not None
    _tombstone(cache, a)
    cache.check_invariants()
    assert a.values[0] is None and cache.match_prefix(seq).prefix_len == 0
    assert cache.stats()["cached_tokens"] == 8
    result = serve(cache, seq, track_adopted_ranges=True)
    assert result.adopted_ranges == {FULL: [(0, 8)]} and result.prefix_len == 16
    assert cache.match_prefix(seq).prefix_len == 16 and cache.stats()["held_tokens"] == 0


def test_dropping_a_leaf_removes_it() -> None:
    """Tombstoning a leaf's full data removes the leaf itself (no empty leaves)."""
    cache = make()
    leaf = serve(cache, [3] * 8).last_node
    _tombstone(cache, leaf)
    assert leaf.seq_len == -1 and cache.stats()["num_nodes"] == 0
    cache.check_invariants()


def test_evicting_a_child_of_a_tombstone_removes_the_tombstone_too() -> None:
    """A tombstoned parent left as a leaf holds nothing and is removed with its last child."""
    cache = make()
    serve(cache, [5] * 8)
    b = serve(cache, [5] * 8 + [6] * 8).last_node
    assert b.parent is not None
    _tombstone(cache, b.parent)
    assert cache.evict(1) == 8 and cache.stats()["num_nodes"] == 0
    cache.check_invariants()


def test_page_size_one_and_sixteen() -> None:
    """The same flows hold with one-token pages and sixteen-token pages."""
    for page_size in (1, 16):
        cache = make(page_size=page_size, num_tokens=256)
        a = list(range(40))
        serve(cache, a)
        serve(cache, a[:17] + [99] * 20)
        expected = 17 if page_size == 1 else 16
        assert cache.match_prefix(a[:17] + [7]).prefix_len == expected
        assert cache.evict(256) == cache.stats()["evicted_tokens"]
        cache.check_invariants()


def test_evict_cost_does_not_scan_the_tree() -> None:
    """Evicting one leaf from a large tree pops a handful of heap entries, not every node."""
    cache = make(page_size=1, num_tokens=4096)
    for i in range(1000):
        serve(cache, [i, i + 1, i + 2], check=False)
    heap = cache.components[0]
    assert isinstance(heap, FullComponent)
    before = heap.evictable.heap_size
    assert cache.evict(1) == 3
    assert before - heap.evictable.heap_size <= 2


def test_invalid_insert_in_a_new_namespace_creates_nothing() -> None:
    """A rejected insert (prev_prefix_len beyond the tree) under an unseen namespace leaves no
    namespace root behind."""
    cache = make()
    fresh = cache.alloc(8)
    assert fresh is not None
    params = InsertParams(
        key=[1] * 8, value=fresh, prev_prefix_len=4, namespace=Namespace(extra_key="new")
    )
    with pytest.raises(ValueError, match="does not own"):
        cache.insert(params)
    assert len(cache.tree.roots()) == 1
    cache.free(fresh)
    cache.check_invariants()
