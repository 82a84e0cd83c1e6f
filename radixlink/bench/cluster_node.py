"""One simulated node of `radixlink bench cluster`: a real index-only ``UnifiedCache`` (page
hashes and KV events on) plus the timing state of its device and its transfer links.

Owns the per-request cache protocol on a node (match + lock on arrival, match again + alloc on
start, insert + unlock on finish) through the public cache API. Must not decide routing or
timing models.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import InsertParams
from radixlink.kvevents import MEDIUM_GPU, BlockStored, KVEvent, KVEventQueue


@dataclass(slots=True, kw_only=True)
class Job:
    """One request on its node, from arrival to first token.

    ``device_len <= prefix_len <= len(key)``: the device prefix (locked), then what was
    transferred (``peer_tokens`` + ``store_tokens``), then what the prefill computes.
    """

    req: int
    node: int
    arrival_s: float
    prompt_len: int
    key: np.ndarray
    device_len: int = 0
    device_slots: torch.Tensor | None = None
    handle: Any = None
    peer_tokens: int = 0
    store_tokens: int = 0
    est_s: float = 0.0
    new_slots: torch.Tensor | None = None
    observed: list[tuple[Any, int, float]] = field(default_factory=list)  # (source, bytes, s)

    @property
    def prefix_len(self) -> int:
        return self.device_len + self.peer_tokens + self.store_tokens


class SimNode:
    """A node: its cache, its device queue (ready jobs by arrival) and its two links
    (transfers in, offloads out), each serving one transfer at a time.

    Args:
        index: the node's number (its KV events carry ``str(index)``).
        page_size: tokens per page.
        device_tokens: device KV capacity in tokens (a page multiple).
        hash_algo: page hash function (matches the router's request hashes).
    """

    def __init__(self, index: int, *, page_size: int, device_tokens: int, hash_algo: str):
        self.index = index
        self.cache = UnifiedCache(CacheConfig(page_size=page_size, num_tokens=device_tokens,
                                              enable_external_cache_linker=True,
                                              hash_algo=hash_algo))
        self.events = self.cache.enable_kv_events(KVEventQueue(max_events=1 << 20,
                                                               node_id=str(index)))
        self.capacity = device_tokens
        self.busy = False
        self.link_free_s = 0.0
        self.uplink_free_s = 0.0
        self._ready: list[tuple[float, int, Job]] = []
        self.truncated = 0
        self.rematched_tokens = 0  # prefix tokens found on the device at start, not arrival

    def arrive(self, job: Job) -> None:
        """Match the prompt on the device and lock that prefix until the job finishes."""
        m = self.cache.match_prefix(job.key)
        job.device_len, job.device_slots = m.prefix_len, m.device_indices
        job.handle = self.cache.lock(m.last_node)

    def transfer(self, now: float, seconds: float) -> float:
        """Queue a transfer of ``seconds`` on the inbound link; returns when it ends."""
        self.link_free_s = max(now, self.link_free_s) + seconds
        return self.link_free_s

    def offload(self, now: float, seconds: float) -> float:
        """Queue an offload of ``seconds`` on the outbound link; returns when it ends."""
        self.uplink_free_s = max(now, self.uplink_free_s) + seconds
        return self.uplink_free_s

    def ready(self, job: Job) -> None:
        heapq.heappush(self._ready, (job.arrival_s, job.req, job))

    def next_job(self) -> Job | None:
        """The ready job that arrived first, if the device is idle; it then holds the device
        and its slots (loaded + computed tokens) are allocated, evicting LRU pages.

        Its prompt is matched again first, as engine schedulers match when they schedule: a
        request that finished meanwhile may have left more of it on the device than the job
        has locked and loaded. Then that longer prefix is locked and nothing is computed
        for it (what was loaded is not used)."""
        if self.busy or not self._ready:
            return None
        job = heapq.heappop(self._ready)[2]
        m = self.cache.match_prefix(job.key)
        if m.prefix_len > job.prefix_len:
            handle = self.cache.lock(m.last_node)
            self.cache.unlock(job.handle)
            self.rematched_tokens += m.prefix_len - job.prefix_len
            job.handle, job.device_len, job.device_slots = handle, m.prefix_len, m.device_indices
            job.peer_tokens = job.store_tokens = 0
        new = self.cache.alloc(len(job.key) - job.device_len)
        if new is None:
            # NOTE: locks of queued jobs pin their prefixes; cache only the part that fits
            # (the prefill itself is unaffected: a real engine would have memory for it).
            fit = job.device_len + self.cache.stats()["free_tokens"]
            job.key = job.key[:fit]
            new = self.cache.alloc(len(job.key) - job.device_len)
            assert new is not None, f"alloc failed after eviction: {self.cache.stats()}"
            self.truncated += 1
        job.new_slots = new
        self.busy = True
        return job

    def finish(self, job: Job) -> None:
        """Insert the prompt's whole pages, free the partial tail, unlock; the device is free."""
        ps = self.cache.page_size
        assert job.new_slots is not None and job.device_slots is not None
        kv = torch.cat([job.device_slots, job.new_slots]) if job.device_len else job.new_slots
        aligned = len(job.key) // ps * ps
        self.cache.insert(InsertParams(key=job.key, value=kv[:aligned],
                                       prev_prefix_len=job.device_len))
        if kv.shape[0] > aligned:
            self.cache.free(kv[aligned:])
        self.cache.unlock(job.handle)
        job.handle = job.new_slots = job.device_slots = None
        self.busy = False

    def drain(self) -> tuple[list[KVEvent], list[str]]:
        """This node's KV events since the last call, and the page hashes its device stored."""
        events = self.events.drain()
        stored = [h for e in events if isinstance(e, BlockStored) and e.medium == MEDIUM_GPU
                  for h in e.block_hashes]
        return events, stored

    def check_idle(self) -> None:
        """Assert that nothing is held: no locks, no request slots."""
        stats = self.cache.stats()
        assert stats["num_locks"] == 0 and stats["held_tokens"] == 0, f"leak: {stats}"
        assert self.events.stats()["dropped"] == 0, "KV events were dropped"
