"""The router's prefix index (radixlink.routing.PrefixIndex): fed only the KV events of real
index-only caches, it answers every node's device prefix exactly as the caches' own matches do,
through inserts and LRU evictions; store events keep the store's pages."""

from __future__ import annotations

import random

import pytest
import torch

from radixlink import CacheConfig, InsertParams, UnifiedCache, page_hashes
from radixlink.kvevents import BlockRemoved, KVEventKind, KVEventQueue, Tier
from radixlink.routing import PrefixIndex

PS = 4


def make_node(index: int, num_tokens: int = 64) -> UnifiedCache:
    cache = UnifiedCache(CacheConfig(page_size=PS, num_tokens=num_tokens,
                                     enable_external_cache_linker=True))
    cache.enable_kv_events(KVEventQueue(node_id=str(index)))
    return cache


def serve(cache: UnifiedCache, prompt: list[int]) -> None:
    """match, lock, alloc the rest (evicting), insert the whole pages, free the tail, unlock."""
    m = cache.match_prefix(prompt)
    handle = cache.lock(m.last_node)
    new = cache.alloc(len(prompt) - m.prefix_len)
    assert new is not None
    kv = torch.cat([m.device_indices, new])
    aligned = len(prompt) // PS * PS
    cache.insert(InsertParams(key=prompt, value=kv[:aligned], prev_prefix_len=m.prefix_len))
    cache.free(kv[aligned:])
    cache.unlock(handle)


def prompts(rng: random.Random) -> list[int]:
    """Prompts sharing a few system prefixes, with conversation-like growth."""
    system = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9, 9], [5, 4, 3, 2, 1, 0, 1, 2]][rng.randrange(3)]
    return system + [rng.randrange(6) for _ in range(rng.randrange(1, 14))]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_index_matches_every_node_through_inserts_and_evictions(seed: int) -> None:
    """Three small caches (16 pages each, so LRU eviction runs): after every request, for
    fresh prompts, the index's per-node device prefix equals each cache's own match."""
    rng = random.Random(seed)
    nodes = [make_node(i) for i in range(3)]
    index = PrefixIndex(["0", "1", "2"])
    removed = 0
    for _ in range(120):
        node = rng.randrange(3)
        serve(nodes[node], prompts(rng))
        events = nodes[node].kv_events.drain()
        removed += sum(isinstance(e, BlockRemoved) for e in events)
        index.apply(events)
        probe = prompts(rng)
        got = index.device_prefix_pages(page_hashes(probe, PS))
        assert [g * PS for g in got] == [n.match_prefix(probe).prefix_len for n in nodes]
    assert removed > 0, "the run must exercise eviction"
    assert index.stats()["events"] == sum(n.kv_events.stats()["emitted"] for n in nodes)


def test_removed_events_empty_a_node() -> None:
    """A node whose pages were all evicted holds no prefix in the index."""
    node = make_node(0, num_tokens=16)
    index = PrefixIndex(["0"])
    first = [1] * 16
    serve(node, first)
    index.apply(node.kv_events.drain())
    assert index.device_prefix_pages(page_hashes(first, PS)) == [4]
    serve(node, [2] * 16)  # evicts every page of the first prompt
    events = node.kv_events.drain()
    assert any(isinstance(e, BlockRemoved) for e in events)
    index.apply(events)
    assert index.device_prefix_pages(page_hashes(first, PS)) == [0]
    assert index.device_prefix_pages(page_hashes([2] * 16, PS)) == [4]


def test_store_events_and_skipped_events() -> None:
    """STORE events keep the store's pages (any node may emit them); HOST events and events
    of unknown nodes are counted as skipped and change nothing."""
    index = PrefixIndex(["a", "b"])
    hashes = page_hashes(list(range(12)), PS)
    q = KVEventQueue(node_id="a")
    q.emit(KVEventKind.STORED, Tier.STORE, hashes[:2])
    q.emit(KVEventKind.STORED, Tier.HOST, hashes)
    KVEventQueue(node_id="zzz").emit(KVEventKind.STORED, Tier.DEVICE, hashes)
    other = KVEventQueue(node_id="zzz")
    other.emit(KVEventKind.STORED, Tier.DEVICE, hashes)
    index.apply(q.drain() + other.drain())
    assert index.store_prefix_pages(hashes) == 2
    assert index.device_prefix_pages(hashes) == [0, 0]
    assert index.stats()["skipped"] == 2
    q.emit(KVEventKind.REMOVED, Tier.STORE, hashes[1:2])
    index.apply(q.drain())
    assert index.store_prefix_pages(hashes) == 1


def test_node_ids_must_be_distinct() -> None:
    """Duplicate or missing node ids are a ValueError."""
    with pytest.raises(ValueError, match="distinct"):
        PrefixIndex(["0", "0"])
    with pytest.raises(ValueError, match="non-empty"):
        PrefixIndex([])


def _wire(kind: str, hashes: list[bytes], medium: str | None, **fields: object) -> dict:
    """One event as a subscriber without vLLM's types decodes vLLM's ZMQ stream (msgpack)."""
    return {"type": kind, "block_hashes": hashes, "medium": medium, **fields}


def test_vllm_stream_events_index_device_and_store() -> None:
    """vLLM's own events, per node stream: GPU events mark that node's device, STORAGE events
    the store for every node (whichever node sent them), CPU and non-first-group events are
    skipped, AllBlocksCleared empties only that node's device. Bytes hashes become hex."""
    raw = [bytes([i]) * 32 for i in range(6)]
    hexes = [h.hex() for h in raw]
    index = PrefixIndex(["a", "b"])
    index.apply([_wire("BlockStored", raw[:4], "GPU", parent_block_hash=None, token_ids=[],
                       block_size=16),
                 _wire("BlockStored", raw, "STORAGE", locality="REMOTE"),
                 _wire("BlockStored", raw, "CPU"),
                 _wire("BlockRemoved", raw[:1], "GPU", group_idx=1)], node_id="a")
    index.apply([_wire("BlockStored", raw[:2], None)], node_id="b")  # None: vLLM's GPU default
    assert index.device_prefix_pages(hexes) == [4, 2]
    assert index.store_prefix_pages(hexes) == 6
    assert index.stats()["skipped"] == 2
    index.apply([_wire("BlockRemoved", raw[3:4], "STORAGE"), {"type": "AllBlocksCleared"}],
                node_id="b")
    assert index.store_prefix_pages(hexes) == 3  # a store delete is seen by every node
    assert index.device_prefix_pages(hexes) == [4, 0]
    index.apply([{"type": "SomethingNew"}], node_id="a")
    assert index.stats()["skipped"] == 3
