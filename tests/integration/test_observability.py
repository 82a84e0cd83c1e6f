"""Observability end to end: latency histograms fed by real transfers, device hit tokens
without the linker's own re-matches, and the KV event stream a router drains."""

from __future__ import annotations

import serving
import torch

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import InsertParams
from radixlink.kvevents import MEDIUM_GPU, MEDIUM_STORAGE, BlockStored, KVEvent, KVEventQueue
from radixlink.linker.core import ExternalCacheLinker
from radixlink.memory.layout import KVLayout
from radixlink.metrics import prometheus_text
from radixlink.stores.memory import MemoryStore

PS = 4


def make_cache(linker: bool = True, num_tokens: int = 64) -> UnifiedCache:
    layout = KVLayout(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32,
                      page_size=PS)
    return UnifiedCache(CacheConfig(page_size=PS, num_tokens=num_tokens, kv_layout=layout,
                                    enable_external_cache_linker=linker))


def serve(cache: UnifiedCache, linker: ExternalCacheLinker | None, tokens: list[int],
          req: str) -> None:
    """One request (tests/serving.py): match (and load), insert, release, flush."""
    assert serving.serve(cache, tokens, linker=linker, req_id=req).insert is not None
    if linker is not None:
        linker.flush()


def test_histograms_count_every_load_and_offload() -> None:
    """load_seconds / offload_seconds count each applied transfer and render as histograms."""
    store = MemoryStore(1 << 20)
    a, b = make_cache(), make_cache()
    la, lb = ExternalCacheLinker(a, store), ExternalCacheLinker(b, store)
    serve(a, la, list(range(10, 26)), "a1")
    serve(a, la, list(range(40, 48)), "a2")
    serve(b, lb, list(range(10, 26)), "b1")
    sa, sb = la.stats(), lb.stats()
    assert sa["offload_seconds"]["count"] == 2 and sa["load_seconds"]["count"] == 0
    assert sb["load_seconds"]["count"] == 1 and sb["loaded_tokens"] == 16
    assert sb["load_seconds"]["sum"] >= 0.0
    text = prometheus_text(b, lb, use_client=False)
    assert "# TYPE radixlink_linker_load_seconds histogram" in text
    assert 'radixlink_linker_load_seconds_bucket{le="+Inf"} 1.0' in text
    la.close()
    lb.close()


def test_hit_tokens_are_request_device_hits_only() -> None:
    """cache hit_tokens counts the request's device prefix, not the linker's publish and
    delivery re-matches; the store tier's tokens are the linker's loaded_tokens."""
    store = MemoryStore(1 << 20)
    x, y = make_cache(), make_cache()
    lx, ly = ExternalCacheLinker(x, store), ExternalCacheLinker(y, store)
    tokens = list(range(100, 132))
    serve(x, lx, tokens, "x")
    new = y.alloc(8)
    assert new is not None
    y.insert(InsertParams(key=tokens[:8], value=new, prev_prefix_len=0))  # no match: no hit
    serve(y, ly, tokens, "y")  # device 8 + store 24
    stats = y.stats()
    assert stats["hit_tokens"] == 8 and stats["match_calls"] == 1
    assert ly.stats()["loaded_tokens"] == 24
    text = prometheus_text(y, ly, use_client=False)
    assert 'radixlink_hit_tokens_total{tier="device"} 8.0' in text
    assert 'radixlink_hit_tokens_total{tier="store"} 24.0' in text
    lx.close()
    ly.close()


def summary(events: list[KVEvent]) -> list[tuple[str, str, tuple[int, int] | None]]:
    tier = {MEDIUM_GPU: "device", MEDIUM_STORAGE: "store"}
    return [("stored" if isinstance(e, BlockStored) else "removed", tier[e.medium],
             e.token_range) for e in events]


def test_event_sequence_insert_offload_evict_revalidation_loss() -> None:
    """Insert, offload, eviction and a revalidation that finds lost pages emit device / store
    STORED / REMOVED events, in order, with the nodes' page hashes."""
    store = MemoryStore(1 << 20)
    cache = make_cache()
    queue = cache.enable_kv_events(KVEventQueue(node_id="n0"))
    linker = ExternalCacheLinker(cache, store, revalidate_after_s=0.0)
    first, second = list(range(10, 26)), list(range(50, 58))
    serve(cache, linker, first, "r1")
    leaf = cache.match_prefix(first).last_node
    hashes = tuple(leaf.hash_value)
    assert cache.evict(16) == 16
    serve(cache, linker, second, "r2")
    store.clear()  # the store loses every page
    serve(cache, linker, second, "r3")  # revalidation finds r2's pages lost, offloads again
    events = queue.drain()
    assert summary(events) == [
        ("stored", "device", (0, 16)), ("stored", "store", (0, 16)),
        ("removed", "device", (0, 16)),
        ("stored", "device", (0, 8)), ("stored", "store", (0, 8)),
        ("removed", "store", (0, 8)), ("stored", "store", (0, 8)),
    ]
    assert events[0].block_hashes == hashes and len(hashes) == 4
    assert events[1].block_hashes == hashes == events[2].block_hashes
    assert all(e.node_id == "n0" and e.namespace_id for e in events)
    assert isinstance(events[0], BlockStored) and events[2].medium == MEDIUM_GPU
    assert queue.drain() == [] and queue.stats()["dropped"] == 0
    linker.close()
    cache.check_invariants()


def test_events_without_hashing_name_nodes_and_ranges() -> None:
    """A cache without page hashes still emits device events, by tree node id and range."""
    cache = make_cache(linker=False)
    queue = cache.enable_kv_events()
    serve(cache, None, list(range(8)), "a")
    serve(cache, None, list(range(4)) + list(range(90, 98)), "b")  # splits [0, 8)
    cache.evict(64)
    events = queue.drain()
    got = summary(events)
    assert got[:2] == [("stored", "device", (0, 8)), ("stored", "device", (4, 12))]
    removed = sorted(r for k, _, r in got[2:] if k == "removed" and r is not None)
    assert removed == [(0, 4), (4, 8), (4, 12)]
    assert all(e.block_hashes == () and e.tree_node_id is not None for e in events)


def test_no_queue_no_events() -> None:
    """Without enable_kv_events nothing is recorded (the hooks stay None)."""
    cache = make_cache(linker=False)
    serve(cache, None, list(range(8)), "a")
    assert cache.kv_events is None and cache.tree.kv_events is None
