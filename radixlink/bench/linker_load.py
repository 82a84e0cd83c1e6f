"""The load part of `radixlink bench linker`: a SmolLM2-size prefix (30 layers x 3 KV heads x 64
dim, fp32, page 16: 720 KiB pages) loaded through the linker into an empty device, beside a
raw read of the same bytes into the same pool, in alternating rounds.

Raw: memory:// -> memcpy of each stored value into a host buffer, then one scatter of the
payloads into the pool; file:// -> open + one readv of each page file into the host buffer,
then one scatter. No checks, no verification: what the linker adds is the difference.
Owns only this part of the benchmark; drives the cache and linker through their public API.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import InsertParams, PoolName
from radixlink.hashing import Namespace
from radixlink.linker.core import ExternalCacheLinker
from radixlink.memory.layout import KVLayout
from radixlink.pages.staging import LEAD, frame_stride
from radixlink.stores.directory import DirectoryStore
from radixlink.stores.registry import open_store

SMOLLM2 = "SmolLM2-135M: 30 layers x 3 KV heads x 64 head dim, fp32, page 16 (720 KiB pages)"
PAGE_SIZE = 16


def smollm2_layout() -> KVLayout:
    return KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, dtype=torch.float32,
                    page_size=PAGE_SIZE)


def _cache(num_pages: int) -> UnifiedCache:
    return UnifiedCache(CacheConfig(page_size=PAGE_SIZE, num_tokens=(num_pages + 2) * PAGE_SIZE,
                                    kv_layout=smollm2_layout(),
                                    namespace=Namespace(model="bench-smollm2-layout"),
                                    enable_external_cache_linker=True))


def _raw_read(store: Any, keys: list[str], host: memoryview, stride: int, lead: int,
              size: int) -> Callable[[], None]:
    """Fill the host rows (page ``i`` at ``i * stride + lead``, ``size`` bytes each) with the
    store's own bytes: one ``readv`` per page file, or one memcpy per stored value."""
    if isinstance(store, DirectoryStore):
        paths = [store.path_of(key) for key in keys]

        def read_files() -> None:
            for i, path in enumerate(paths):
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.readv(fd, [host[i * stride + lead : i * stride + lead + size]])
                finally:
                    os.close(fd)
        return read_files
    blobs = store.get(keys)  # NOTE: references to the stored bytes (memory://)

    def copy_blobs() -> None:
        for i, blob in enumerate(blobs):
            host[i * stride + lead : i * stride + lead + size] = blob
    return copy_blobs


def measure(store_url: str, *, num_pages: int, rounds: int, seed: int = 0) -> dict[str, Any]:
    """Offload ``num_pages`` random pages once, then ``rounds`` x (linker load into an empty
    device, raw read + scatter), alternating. The linker side is timed from ``load`` to its
    outcome (reserve, read, verify, land, publish); both sides land byte-identical pages."""
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="radixlink-bench-load-")
    store = open_store(store_url.replace("{dir}", tmp))
    try:
        tokens = list(range(1000, 1000 + num_pages * PAGE_SIZE))
        writer = _cache(num_pages)
        w_linker = ExternalCacheLinker(writer, store)
        slots = writer.alloc(len(tokens))
        assert slots is not None
        pool = writer.pool(PoolName.KV)
        gen = torch.Generator().manual_seed(seed)
        raw_bytes = pool.storage.view(torch.uint8)
        raw_bytes.copy_(torch.randint(0, 256, raw_bytes.shape, dtype=torch.uint8, generator=gen))
        writer.insert(InsertParams(key=tokens, value=slots))
        w_linker.flush()
        expected = pool.read_pages(slots)
        w_linker.close()

        reader = _cache(num_pages)
        linker = ExternalCacheLinker(reader, store)
        target = reader.pool(PoolName.KV)
        page_bytes = target.layout.page_bytes
        keys = [key for key, _ in store.scan()]
        assert len(keys) == num_pages, f"{len(keys)} pages stored, {num_pages} expected"
        # NOTE: the raw side reads whole values into rows laid out like the linker's staging
        # (payloads 16-byte aligned, so the scatter needs no repacking) in the same arena.
        size = len(store.get(keys[:1])[0] or b"")
        stride, lead = frame_stride(size), LEAD
        buffer, view = linker.parts.arena.acquire(num_pages * stride)
        payloads = buffer.as_strided((num_pages, page_bytes), (stride, 1),
                                     lead + size - page_bytes)
        read = _raw_read(store, keys, view, stride, lead, size)
        raw_slots = torch.arange(PAGE_SIZE, (num_pages + 1) * PAGE_SIZE, dtype=torch.int64)

        def raw() -> float:
            start = time.perf_counter()
            read()
            target.write_pages(raw_slots, payloads)
            return time.perf_counter() - start

        def load(i: int) -> float:
            reader.evict(reader.stats()["cached_tokens"])
            m = reader.match_prefix(tokens, req_id=i)
            assert m.external_hit_len == len(tokens), f"lookup found {m.external_hit_len}"
            start = time.perf_counter()
            assert linker.load(i)
            out = linker.wait_load(i)
            seconds = time.perf_counter() - start
            assert out.ok and out.loaded_len == len(tokens), out.reason
            got = target.read_pages(out.device_indices)
            reader.unlock(out.lock)
            assert torch.equal(got, expected), "loaded pages differ from the offloaded ones"
            return seconds

        load(-1)
        raw()
        times: dict[str, list[float]] = {"linker": [], "raw": []}
        for r in range(rounds):
            for side in (("linker", "raw") if r % 2 == 0 else ("raw", "linker")):
                times[side].append(load(r) if side == "linker" else raw())
        linker.close()
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    mb = num_pages * page_bytes / 1e6
    med = {side: statistics.median(v) for side, v in times.items()}
    return {"store": store_url.split("?")[0].replace("{dir}", ""), "pages": num_pages, "MB": mb,
            "linker ms": med["linker"] * 1e3, "raw ms": med["raw"] * 1e3,
            "linker GB/s": mb / 1e3 / med["linker"], "raw GB/s": mb / 1e3 / med["raw"],
            "linker/raw": med["raw"] / med["linker"],
            "rounds": {side: [round(x * 1e3, 2) for x in v] for side, v in times.items()}}
