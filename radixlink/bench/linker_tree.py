"""The tree workload of `radixlink bench linker`: the requests of `bench tree` through a plain
tree and through trees with an ``ExternalCacheLinker`` attached (write-through to memory:// or
file://), CPU per request side by side in rotating rounds.

Owns only this part of the benchmark; drives ``UnifiedCache`` / ``ExternalCacheLinker``
through their public methods.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from radixlink.bench.workload import ChatRequest
from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import InsertParams
from radixlink.hashing import Namespace
from radixlink.linker.core import ExternalCacheLinker
from radixlink.memory.layout import KVLayout
from radixlink.stores.registry import open_store


@dataclass(frozen=True, slots=True, kw_only=True)
class Mode:
    """One way of serving the workload: ``store`` None is the plain tree (indices only, no
    hashing); otherwise a linker on that store URL (``{dir}`` becomes a fresh directory)."""

    name: str
    store: str | None = None
    lookups: bool = False  # match with a req_id (store LOOKUP) and load store hits
    # without a store: "layout" gives the tree the linker's KV pools, "hashed" also its page
    # hashes (what a linker-enabled cache does before any linker work), "" neither
    kv: str = ""


def tiny_layout(page_size: int, head_dim: int) -> KVLayout:
    """The smallest real layout (1 layer, 1 KV head, uint8): the linker's bookkeeping, not
    its memcpy, is what the CPU figures then show."""
    return KVLayout(num_layers=1, num_kv_heads=1, head_dim=head_dim, dtype=torch.uint8,
                    page_size=page_size)


def serve_all(requests: Sequence[ChatRequest], cache: UnifiedCache,
              linker: ExternalCacheLinker | None, lookups: bool) -> dict[str, int]:
    """The `bench tree` protocol per request: match -> (load) -> lock -> alloc -> insert
    prompt + output -> free the tail -> unlock. Returns hit counts."""
    ps = cache.page_size
    device_hits = store_hits = 0
    for i, req in enumerate(requests):
        seq = req.prompt + req.output
        m = cache.match_prefix(req.prompt, req_id=i if lookups else None)
        hit, slots = m.prefix_len, m.device_indices
        device_hits += hit
        if lookups and linker is not None and m.external_hit_len and linker.load(i):
            out = linker.wait_load(i)
            handle, hit, slots = out.lock, out.prefix_len, out.device_indices
            store_hits += out.loaded_len
        else:
            handle = cache.lock(m.last_node)
        new = cache.alloc(len(seq) - hit)
        assert new is not None, "allocation failed after eviction: capacity below one request"
        kv = torch.cat([slots, new]) if hit else new
        aligned = len(seq) // ps * ps
        cache.insert(InsertParams(key=seq, value=kv[:aligned], prev_prefix_len=hit))
        if len(kv) > aligned:
            cache.free(kv[aligned:])
        cache.unlock(handle)
    return {"device_hit_tokens": device_hits, "store_hit_tokens": store_hits}


def run_mode(requests: Sequence[ChatRequest], mode: Mode, capacity: int, page_size: int,
             head_dim: int) -> dict[str, Any]:
    """One round of one mode on a fresh cache (and a fresh store): process CPU and engine
    thread CPU for the whole run (offloads flushed), pages offloaded."""
    linked = mode.store is not None
    layout, hashed = linked or mode.kv in ("layout", "hashed"), linked or mode.kv == "hashed"
    cache = UnifiedCache(CacheConfig(
        page_size=page_size, num_tokens=capacity,
        kv_layout=tiny_layout(page_size, head_dim) if layout else None,
        namespace=Namespace(model="bench-tiny-layout"),  # NOTE: shared stores need one
        enable_external_cache_linker=hashed))
    tmp = tempfile.mkdtemp(prefix="radixlink-bench-linker-") if linked else None
    linker = None
    if linked:
        assert mode.store is not None and tmp is not None
        linker = ExternalCacheLinker(cache, open_store(mode.store.replace("{dir}", tmp)))
    try:
        cpu0, thread0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
        hits = serve_all(requests, cache, linker, mode.lookups)
        if linker is not None:
            linker.flush()
        cpu, thread = time.process_time() - cpu0, time.thread_time() - thread0
        wall = time.perf_counter() - wall0
        stats = linker.stats() if linker is not None else {}
    finally:
        if linker is not None:
            linker.close()
            linker.store.close()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"cpu_s": cpu, "thread_s": thread, "wall_s": wall,
            "offloaded_pages": int(stats.get("offloaded_pages", 0)),
            "known_pages_skipped": int(stats.get("known_pages_skipped", 0)), **hits}


def compare(requests: Sequence[ChatRequest], modes: Sequence[Mode], capacity: int,
            page_size: int, head_dim: int, rounds: int) -> list[dict[str, Any]]:
    """Every mode, ``rounds`` times in rotating order (so load spikes hit all alike); one
    row per mode with medians and the ratio to the first mode (the plain tree)."""
    runs: dict[str, list[dict[str, Any]]] = {m.name: [] for m in modes}
    for r in range(rounds):
        order = list(modes[r % len(modes):]) + list(modes[: r % len(modes)])
        for mode in order:
            runs[mode.name].append(run_mode(requests, mode, capacity, page_size, head_dim))
    n = len(requests)
    prompt_tokens = sum(len(r.prompt) for r in requests)
    base = statistics.median(x["cpu_s"] for x in runs[modes[0].name])
    rows = []
    for mode in modes:
        got = runs[mode.name]
        cpu = statistics.median(x["cpu_s"] for x in got)
        last = got[-1]
        rows.append({
            "capacity": capacity, "mode": mode.name,
            "cpu us/req": cpu / n * 1e6,
            "vs plain": cpu / base,
            "engine thread us/req": statistics.median(x["thread_s"] for x in got) / n * 1e6,
            "pages offloaded/req": last["offloaded_pages"] / n,
            "known pages skipped/req": last["known_pages_skipped"] / n,
            "device hit": last["device_hit_tokens"] / prompt_tokens,
            "store hit": last["store_hit_tokens"] / prompt_tokens,
            "cpu s (rounds)": [round(x["cpu_s"], 3) for x in got],
        })
    return rows
