"""The offload data path: a prefix evicted and inserted again is not written again (its pages
are known to be stored) unless the store lost them; inserts that follow one another share one
store write, a lone insert goes out at once; a queued page keeps the bytes it had when its
node was inserted even if eviction reuses its slots; a lookup's page hashes serve the insert.
"""

from __future__ import annotations

import threading
import time

import oracle
import serving
import torch

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import PoolName
from radixlink.hashing import namespace_id, page_hashes
from radixlink.linker.core import ExternalCacheLinker
from radixlink.memory.layout import KVLayout
from radixlink.stores import PageCodec, page_key
from radixlink.stores.memory import MemoryStore

PS = 4
LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype=torch.float32, page_size=PS)
A = list(range(100, 140))  # 10 pages
B = list(range(500, 540))  # 10 other pages


def make_cache(num_tokens: int = 256) -> UnifiedCache:
    return UnifiedCache(CacheConfig(page_size=PS, num_tokens=num_tokens, kv_layout=LAYOUT,
                                    enable_external_cache_linker=True))


def fill(cache: UnifiedCache, kv: torch.Tensor, tokens: list[int], start: int) -> None:
    """What a model writes at ``kv[start:]``: values that name the whole prefix and the
    namespace (tests/oracle.py)."""
    oracle.write(cache, kv[start:], tokens, start)


def serve(cache: UnifiedCache, tokens: list[int], **kw: object) -> serving.Served:
    return serving.serve(cache, tokens, compute=fill, **kw)


def keys_of(cache: UnifiedCache, tokens: list[int]) -> list[str]:
    """The store keys of the KV pages of ``tokens`` in the cache's namespace (rank 0: the
    KV pool differs per rank, so its keys carry it)."""
    ns = cache.config.namespace
    return [page_key(namespace_id(ns), h, PoolName.KV, rank=0)
            for h in page_hashes(tokens, PS, ns, algo=cache.config.hash_algo)]


def test_a_prefix_inserted_again_after_eviction_is_not_written_again() -> None:
    """Scenario: insert A (10 pages written), evict it from the device, insert A again: no
    page is written again, and the new nodes are marked stored; another cache still loads
    A from the store, byte-identical."""
    store = MemoryStore(64 << 20)
    cache = make_cache(num_tokens=64)
    linker = ExternalCacheLinker(cache, store)
    serve(cache, A)
    linker.flush()
    assert linker.stats()["offloaded_pages"] == 10
    serve(cache, B)  # needs the room: evicts A
    linker.flush()
    assert cache.match_prefix(A).prefix_len == 0
    serve(cache, A)
    linker.flush()
    stats = linker.stats()
    assert stats["offloaded_pages"] == 20, stats  # B's 10 pages; none of A's again
    assert stats["known_pages_skipped"] == 10
    assert cache.match_prefix(A).last_node.external_cache_stored
    other = make_cache()
    reader = ExternalCacheLinker(other, store)
    got = serve(other, A, linker=reader, req_id="r")
    assert got.load is not None and got.load.ok and got.load.loaded_len == 40
    reader.close()
    linker.close()


def test_pages_the_store_lost_are_written_again() -> None:
    """The store dropped A's pages: a lookup that finds them absent makes the record forget
    them, so the insert writes them again; with revalidate_after_s=0 nothing is trusted."""
    store = MemoryStore(64 << 20)
    cache = make_cache(num_tokens=64)
    linker = ExternalCacheLinker(cache, store)
    serve(cache, A)
    serve(cache, B)  # evicts A
    linker.flush()
    store.clear()
    serve(cache, A, linker=linker, req_id="again")  # LOOKUP sees A absent
    linker.flush()
    assert linker.stats()["offloaded_pages"] == 30
    assert store.exists(keys_of(cache, A)) == [True] * 10
    linker.close()
    cache = make_cache(num_tokens=64)
    untrusting = ExternalCacheLinker(cache, MemoryStore(64 << 20), revalidate_after_s=0.0)
    for tokens in (A, B, A):
        serve(cache, tokens)
    untrusting.flush()
    assert untrusting.stats()["offloaded_pages"] == 30
    untrusting.close()


def test_inserts_in_a_row_share_one_store_write_and_a_lone_one_is_not_delayed() -> None:
    """Ten inserts within the batch window go out in fewer writes than offloads; after a
    pause, a lone insert is in the store without any flush or poll."""
    cache = make_cache(num_tokens=1024)
    linker = ExternalCacheLinker(cache, MemoryStore(64 << 20))
    linker.offload.batch_window_s = 60.0
    for i in range(10):
        serve(cache, [1000 * (i + 1) + t for t in range(8)])
    linker.poll()
    linker.flush()
    stats = linker.stats()
    assert stats["offloads"] == 10 and stats["offload_batches"] < 10, stats
    linker.offload.batch_window_s = 0.0
    serve(cache, A)
    deadline = time.monotonic() + 10
    while not all(linker.store.exists(keys_of(cache, A))):
        assert time.monotonic() < deadline, "a lone insert was not sent"
        time.sleep(0.01)
    linker.close()


def test_a_queued_page_keeps_its_bytes_when_eviction_reuses_its_slots() -> None:
    """Scenario: A's offload is queued, not sent; B's insert evicts A and reuses its slots
    with other data; the store still gets A's own bytes (eviction gathered them first)."""
    store = MemoryStore(64 << 20)
    cache = make_cache(num_tokens=48)
    linker = ExternalCacheLinker(cache, store)
    linker.offload.batch_window_s = 60.0
    serve(cache, list(range(900, 908)))  # the first offload goes out at once
    serve(cache, A)  # queued
    slots = cache.match_prefix(A).device_indices.clone()
    expected = cache.pool(PoolName.KV).read_pages(slots)
    assert linker.stats()["offload_batches"] == 1
    serve(cache, B)  # evicts A, writes B's data into the freed slots
    linker.flush()
    codec = PageCodec(LAYOUT.fingerprint(PoolName.KV), LAYOUT.page_bytes)
    keys = keys_of(cache, A)
    got = [codec.decode(blob, key) for blob, key in zip(store.get(keys), keys)]
    assert all(g is not None for g in got)
    assert torch.equal(torch.frombuffer(bytearray(b"".join(got)), dtype=torch.uint8)
                       .view(10, -1), expected)
    linker.close()


def test_the_insert_reuses_the_page_hashes_of_its_lookup() -> None:
    """match_prefix(req_id) hashes the uncached tail; the insert of those tokens takes the
    hashes from there (counted), and they equal a fresh hash of the same pages."""
    cache = make_cache()
    linker = ExternalCacheLinker(cache, MemoryStore(64 << 20))
    serve(cache, A[:20])
    before = linker.stats()["hash_reuses"]
    serve(cache, A, linker=linker, req_id="r")
    assert linker.stats()["hash_reuses"] == before + 1
    node = cache.match_prefix(A).last_node
    fresh = page_hashes(A, PS, cache.config.namespace, algo=cache.config.hash_algo)
    path_hashes = [h for n in cache.tree.path_to(node) for h in n.hash_value]
    assert path_hashes == fresh
    linker.close()


class _ThreadRecordingStore(MemoryStore):
    """A memory store that notes which thread each put ran on."""

    def __init__(self, in_process: bool) -> None:
        super().__init__(64 << 20)
        self.in_process = in_process
        self.put_threads: list[int] = []

    def put(self, items):  # type: ignore[no-untyped-def]
        self.put_threads.append(threading.get_ident())
        return super().put(items)


def test_offloads_to_an_in_process_store_run_on_the_engine_thread() -> None:
    """A memory store (in_process) gets the offload's put on the engine thread, inside the
    insert, and the pages are stored before any poll; a store that may wait gets it on the
    worker thread. Both end with the same pages stored and marked."""
    engine = threading.get_ident()
    for in_process in (True, False):
        store = _ThreadRecordingStore(in_process)
        cache = make_cache()
        linker = ExternalCacheLinker(cache, store)
        serve(cache, A)  # a lone insert: its batch goes out at once
        if in_process:
            assert store.put_threads == [engine]
            assert store.stats()["pages"] == 10  # written before any poll or flush
        linker.flush()
        assert len(store.put_threads) == 1 and (store.put_threads[0] == engine) == in_process
        assert linker.stats()["offloaded_pages"] == 10
        assert cache.match_prefix(A).last_node.external_cache_stored
        linker.close()
