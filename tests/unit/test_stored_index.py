"""The stored index is the one record of "the store holds this page": node store marks are views
on it by page hash, so split fragments and a prefix inserted again carry the marks without any
callback, one confirmation time serves both skipping a write and revalidation age, and its
bound drops the earliest confirmed pages first."""

from __future__ import annotations

from typing import Any

import pytest
import serving
import torch

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import PoolName
from radixlink.linker.core import ExternalCacheLinker
from radixlink.memory.layout import KVLayout
from radixlink.stores.memory import MemoryStore
from radixlink.tree.node import TreeNode
from radixlink.tree.stored import StoredPages

KV = PoolName.KV


def make(num_tokens: int = 64) -> UnifiedCache:
    return UnifiedCache(CacheConfig(page_size=4, num_tokens=num_tokens,
                                    enable_external_cache_linker=True))


def serve(cache: UnifiedCache, seq: list[int]) -> Any:
    result = serving.serve(cache, seq).insert
    assert result is not None
    return result.last_node


def test_marks_are_views_on_the_index_and_follow_pages_through_a_split() -> None:
    """Scenario: node N = 4 pages, its pages confirmed and an offload ticket on them; a split
    at page 2 leaves both fragments stored, confirmed at the same time and in flight with the
    same ticket (nothing copied: the tree has no split callback); clearing the ticket on the
    queued pages (as an offload's end does) clears both."""
    cache = make()
    seq = list(range(16))
    node = serve(cache, seq)
    index = cache.tree.stored
    assert not node.external_cache_stored and node.stored_at is None
    hashes = list(node.hash_value)
    index.add(KV, hashes, at=5.0)
    index.set_inflight(hashes, 3)
    assert node.external_cache_stored and node.stored_at == 5.0 and node.offload_inflight == 3
    serve(cache, seq[:8] + [90] * 8)
    front = node.parent
    assert front is not None and front.num_tokens == 8
    for part in (front, node):
        assert part.external_cache_stored and part.stored_at == 5.0
        assert part.offload_inflight == 3
    index.clear_inflight(hashes, 3)
    assert front.offload_inflight == node.offload_inflight == 0
    index.discard(KV, hashes[:1])  # the store lost the front's first page
    assert not front.external_cache_stored and node.external_cache_stored
    cache.check_invariants()


def test_a_prefix_inserted_again_is_stored_by_its_pages() -> None:
    """Scenario: A is confirmed, evicted (its nodes leave the tree), inserted again: the new
    node reads stored (its pages are the same), with the old confirmation time."""
    cache = make(num_tokens=32)
    a = list(range(100, 116))
    node = serve(cache, a)
    cache.tree.stored.add(KV, node.hash_value, at=7.0)
    serve(cache, list(range(500, 532)))  # needs the room: evicts A
    assert node.seq_len < 0 and cache.match_prefix(a).prefix_len == 0
    again = serve(cache, a)
    assert again is not node and again.external_cache_stored and again.stored_at == 7.0


def test_one_clock_and_a_deterministic_bound() -> None:
    """A confirmation older than the age is still a mark (revalidation reads its age) but no
    longer skips a write; past the bound the earliest confirmed pages go, whatever their time;
    refresh changes times only; bad bounds are refused before anything changes."""
    now = [100.0]
    index = StoredPages(4, 10.0, lambda: now[0])
    index.add(KV, ["a", "b"])
    now[0] = 111.0
    assert index.holds(["a", "b"]) and index.confirmed_at(["a", "b"]) == 100.0
    assert index.unknown(KV, ["a", "b"])[0] is None  # stale: written again
    index.refresh(KV, ["a", "zz"], 111.0)
    assert index.confirmed_at(["a"]) == 111.0 and not index.holds(["zz"])
    index.add(KV, ["c", "d", "e"], at=50.0)  # older times, later confirmations
    assert len(index) == 4 and not index.holds(["a"]) and index.holds(["b", "c", "d", "e"])
    with pytest.raises(ValueError, match="max_known_pages"):
        index.configure(-1, 10.0)
    with pytest.raises(ValueError, match="age bound"):
        index.configure(4, 0.0)
    assert index.max_pages == 4 and index.max_age_s == 10.0


def test_a_node_without_an_index_or_hashes_has_no_marks() -> None:
    """A node outside any tree (or of a tree without page hashes) reads unstored and refuses
    to be marked, naming the fix."""
    node = TreeNode(1, b"\0" * 16, None, 1)
    assert not node.external_cache_stored and node.stored_at is None
    assert node.offload_inflight == 0
    with pytest.raises(ValueError, match="enable_external_cache_linker"):
        node.external_cache_stored = True


def test_a_new_linker_trusts_nothing_an_earlier_one_recorded() -> None:
    """#23 (one stored index): linker 1 offloads A to store 1 and closes; linker 2 attaches to
    the same cache with store 2. A's next hit writes A to store 2. The old node marks outlived
    linker 1, so A stayed marked stored and store 2 never got it."""
    layout = KVLayout(num_layers=1, num_kv_heads=1, head_dim=4, dtype=torch.float32,
                      page_size=4)
    cache = UnifiedCache(CacheConfig(page_size=4, num_tokens=64, kv_layout=layout,
                                     enable_external_cache_linker=True))
    a = list(range(100, 116))
    first, second = MemoryStore(1 << 20), MemoryStore(1 << 20)
    linker = ExternalCacheLinker(cache, first)
    serve(cache, a)
    assert linker.flush(timeout=10) and cache.match_prefix(a).last_node.external_cache_stored
    linker.close()
    linker = ExternalCacheLinker(cache, second)
    assert not cache.match_prefix(a).last_node.external_cache_stored
    serve(cache, a)
    assert linker.flush(timeout=10)
    assert linker.stats()["offloaded_pages"] == 4 and second.stats()["pages"] == 4
    assert cache.match_prefix(a).last_node.external_cache_stored
    linker.close()
    cache.check_invariants()
