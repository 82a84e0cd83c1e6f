"""The worker-side half of the connector: loads and saves between one TP rank's KV tensors and
the store, on background threads, with completions drained on the model runner's thread.

Owns threads, codecs and the load/save queues of one worker. Device writes happen only on the
caller's thread (``transfer_results``), so they are ordered with the model's own kernels; the
threads only talk to the store. Never raises across threads: a failed load is a load error.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from radixlink.integrations.vllm.keys import GroupLayout, KeyScheme
from radixlink.integrations.vllm.loads import FetchedBatch, RequestLoad, fetch_batch
from radixlink.integrations.vllm.metadata import GroupPages, PageJob
from radixlink.integrations.vllm.pages import PagedGroup
from radixlink.integrations.vllm.reports import WorkerReports
from radixlink.pages import pageio
from radixlink.pages.staging import StagingArena
from radixlink.stores.base import Store

logger = logging.getLogger(__name__)

STAT_NAMES = (
    "loaded_pages", "fetched_pages", "bad_pages", "healed_pages", "saved_pages",
    "skipped_pages", "dropped_saves", "failed_loads", "failed_saves",
)  # fmt: skip


class WorkerSide:
    """Loads and saves of one worker (one TP rank).

    A step's loads are one batch: each distinct page key is read from the store once, however
    many requests of the step share it, and scattered into each request's own blocks (vLLM
    does not share device blocks between requests still loading). Every bad page of a batch
    (missing, corrupt, foreign key, truncated, wrong layout, unsealed) is counted with its
    reason; the present ones are deleted from the store and overwritten by the next save of
    their recomputed pages (the heal), so a damaged store is mended in one pass: the one
    corrupt-page policy of ``pages.pageio``, which does the store I/O.

    Args:
        layouts: the groups taking part (same list as the scheduler side).
        scheme: key naming shared with the scheduler.
        store: the page store (owned: closed by ``close``).
        tp_rank: this worker's tensor-parallel rank (part of every key and fingerprint).
        num_threads: store I/O threads.
        max_inflight_save_bytes: host bytes of saves queued at once; past it saves are
            dropped and counted (a dropped save is a later miss, never a stall).
        block_errors: report failed loads as block ids (one KV cache group: vLLM keeps the
            verified prefix); otherwise as failed requests (vLLM recomputes them whole).
        kv_events: report what the store I/O did to which page (``reports``: the KV events
            of vLLM's ``--kv-events-config``).
    """

    def __init__(self, *, layouts: Sequence[GroupLayout], scheme: KeyScheme, store: Store,
                 tp_rank: int, num_threads: int, max_inflight_save_bytes: int,
                 block_errors: bool, kv_events: bool = False):  # fmt: skip
        self._layouts = {g.group_id: g for g in layouts}
        self._scheme = scheme
        self._store = store
        self._rank = tp_rank
        self._block_errors = block_errors
        self._max_inflight = max_inflight_save_bytes
        self._groups: dict[int, PagedGroup] = {}
        self._codecs: dict[int, pageio.Codec] = {}
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="radixlink-vllm")
        self._done: queue.Queue[FetchedBatch] = queue.Queue()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self._inflight_bytes = 0
        self._finished_sending: set[str] = set()
        self._load_errors: set[int] = set()
        self._bad = pageio.BadKeys()  # found bad here: the next save never skips them
        self._kv_caches: Mapping[str, torch.Tensor] = {}
        self._num_blocks = 0
        self._arena = StagingArena(max_cached_bytes=min(max_inflight_save_bytes, 256 << 20))
        self.stats = dict.fromkeys(STAT_NAMES, 0)
        self._reported = dict.fromkeys(STAT_NAMES, 0)
        self.reports = WorkerReports(tp_rank, self._keys) if kv_events else None

    def register(self, kv_caches: Mapping[str, torch.Tensor], num_blocks: int) -> None:
        """Bind every group to its layers' tensors and build its codec.

        Raises:
            ValueError: a layer of a taking-part group is missing from ``kv_caches``.
        """
        groups = {}
        for gid, layout in self._layouts.items():
            missing = [n for n in layout.layer_names if n not in kv_caches]
            if missing:
                raise ValueError(
                    f"RadixlinkConnector: register_kv_caches lacks layers {missing[:4]} of KV "
                    f"cache group {gid}; got {sorted(kv_caches)[:8]}"
                )
            groups[gid] = PagedGroup([_by_block(kv_caches[n], num_blocks)
                                      for n in layout.layer_names])  # fmt: skip
        self._groups = groups
        self._kv_caches, self._num_blocks = kv_caches, num_blocks
        for gid, group in groups.items():
            fingerprint = (f"{self._scheme.model}|{self._layouts[gid].description}|"
                           f"rank{self._rank}|{group.order}|{group.page_bytes}")  # fmt: skip
            self._codecs[gid] = pageio.make_codec(fingerprint, group.page_bytes,
                                                  secret=self._store.page_secret)
        if any(g.device.type == "cuda" for g in groups.values()) and not self._arena.pinned:
            self._arena = StagingArena(pinned=True, max_cached_bytes=self._arena.max_cached_bytes)

    @property
    def registered(self) -> bool:
        """Whether the worker holds views of KV tensors (False between sleep and wake-up)."""
        return bool(self._groups)

    def unregister(self) -> None:
        """Sleep: drop the views of the KV tensors (vLLM unmaps their memory). Waits for every
        queued load and save, fails the loads not scattered yet (reported by the next
        ``transfer_results``; their requests recompute). Idempotent."""
        self.flush()
        drained = []
        while True:
            try:
                batch = self._done.get_nowait()
            except queue.Empty:
                break
            batch.release(self._arena)
            for load in batch.requests:
                load.error = load.error or "KV caches unregistered (sleep) before the scatter"
                load.bad_blocks.update(b for _, block_ids, _ in load.pages for b in block_ids)
                load.pages.clear()
            drained.append(batch)
        for batch in drained:  # NOTE: still reported (as failed) by the next transfer_results
            self._done.put(batch)
        self._groups = {}

    def restore(self) -> None:
        """Wake-up: bind the views again to the registered tensors (vLLM maps their memory back
        at the same addresses). Idempotent."""
        if not self._groups and self._kv_caches:
            self.register(self._kv_caches, self._num_blocks)

    def start_loads(self, jobs: Sequence[PageJob]) -> None:
        """Queue this step's loads as one batch on the I/O threads (store reads and verify;
        no device writes)."""
        if jobs:
            self._submit(self._load, list(jobs))

    def save(self, jobs: Sequence[PageJob]) -> None:
        """Copy each job's pages out now (the blocks may be reused after this step) into
        reused staging buffers, then queue the store writes. Finishing requests are reported
        done once copied (or once their save was dropped: the bound below)."""
        for job in jobs:
            groups = [g for g in job.groups if g.block_ids]
            sizes = [len(g.block_ids) * self._groups[g.group_id].page_bytes for g in groups]
            num_bytes = sum(sizes)
            if job.finishing:
                self._finished_sending.add(job.req_id)
            with self._lock:
                if self._inflight_bytes + num_bytes > self._max_inflight:
                    self.stats["dropped_saves"] += 1
                    continue
                self._inflight_bytes += num_bytes
            staging = [self._arena.acquire(size) for size in sizes]
            pages = [(g, self._groups[g.group_id].gather(g.block_ids, buf[:size]))
                     for g, size, (buf, _) in zip(groups, sizes, staging, strict=True)]
            self._submit(self._put, job, pages, num_bytes, staging)

    def transfer_results(self) -> tuple[set[str], set[str], set[str]]:
        """Drain finished transfers: scatter verified pages into the KV tensors (this thread),
        and return ``(finished_sending, finished_recving, failed_recving)``."""
        recving: set[str] = set()
        failed: set[str] = set()
        while True:
            try:
                batch = self._done.get_nowait()
            except queue.Empty:
                break
            for load in batch.requests:
                recving.add(load.req_id)
                if load.failed and not self._block_errors:
                    failed.add(load.req_id)
            self._finish_batch(batch)
        sending, self._finished_sending = self._finished_sending, set()
        return sending, recving, failed

    def staging_stats(self) -> dict[str, int]:
        """The save staging buffers: ``staging_allocs``, ``staging_reuses``,
        ``staging_cached_bytes``."""
        return self._arena.stats()

    def store_stats(self) -> dict[str, Any]:
        """This worker's store's own counters (``hits``, ``misses``, ``puts`` ...)."""
        return self._store.stats()

    def take_stats(self) -> dict[str, int]:
        """``stats`` counted since the last call (only the nonzero ones): the per-interval
        payload of vLLM's connector stats."""
        with self._lock:
            now = dict(self.stats)
        delta = {name: now[name] - self._reported[name] for name in STAT_NAMES}
        self._reported = now
        return {name: value for name, value in delta.items() if value}

    def take_load_errors(self) -> set[int]:
        """Block ids whose load failed since the last call (one-group layouts only)."""
        errors, self._load_errors = self._load_errors, set()
        return errors

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until no load or save is queued or running; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self) -> None:
        """Finish queued transfers, stop the threads and close the store. Idempotent."""
        self._pool.shutdown(wait=True)
        self._store.close()

    def _finish_batch(self, batch: FetchedBatch) -> None:
        """Scatter each request's verified pages (skipped for a request vLLM recomputes
        whole), log each failed load once, then give the staging back."""
        try:
            for load in batch.requests:
                if load.failed:
                    self._fail(load)
                    if not self._block_errors:
                        continue
                for gid, block_ids, rows in load.pages:
                    self._groups[gid].scatter(block_ids, batch.payloads[gid], rows)
                    self.stats["loaded_pages"] += len(block_ids)
                self._load_errors |= load.bad_blocks
        finally:
            batch.release(self._arena)

    def _fail(self, load: RequestLoad) -> None:
        with self._lock:
            self.stats["failed_loads"] += 1
        kept = sum(len(block_ids) for _, block_ids, _ in load.pages) if self._block_errors else 0
        logger.warning("radixlink load of request %s failed: %s; %d verified leading pages "
                       "kept, the rest is recomputed", load.req_id, load.describe(), kept)

    def _submit(self, fn: Callable[..., None], *args: Any) -> None:
        with self._lock:
            self._pending += 1
        self._pool.submit(self._guarded, fn, *args)

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - a failure is a status, never a raise across threads
            logger.exception("radixlink transfer failed")
        finally:
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()

    def _load(self, jobs: list[PageJob]) -> None:
        try:
            batch = fetch_batch(jobs, store=self._store, codecs=self._codecs,
                                arena=self._arena, keys=self._keys, bad=self._bad)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - store died, timeouts: every load fails
            error = f"{type(exc).__name__}: {exc}"
            batch = FetchedBatch(requests=[
                RequestLoad(req_id=job.req_id, num_pages=job.num_pages, error=error,
                            bad_blocks={b for g in job.groups for b in g.block_ids})
                for job in jobs
            ])  # fmt: skip
        else:
            if self.reports is not None:
                self.reports.after_read(jobs, batch)
        with self._lock:
            self.stats["fetched_pages"] += batch.num_fetched
            self.stats["bad_pages"] += len(batch.bad_keys)
        self._done.put(batch)

    def _put(self, job: PageJob, pages: list[tuple[GroupPages, torch.Tensor]],
             num_bytes: int, staging: list[tuple[torch.Tensor, memoryview]]) -> None:
        counts = {"saved_pages": 0, "skipped_pages": 0, "failed_saves": 0, "healed_pages": 0}
        frames = None
        try:
            # NOTE: one presence batch per group first: pages another instance (or an earlier
            # request) stored are not encoded or sent again, unless found bad here or the
            # request's load failed (pages past the failure were never verified).
            frames, parts = pageio.stage_pages(self._arena, [
                (self._codecs[g.group_id], self._keys(job, g.group_id, g.hashes))
                for g, _ in pages])  # fmt: skip
            for part, (_, data) in zip(parts, pages):
                part.frames.payloads().copy_(data)
            written = pageio.write(self._store, parts, skip_present=not job.overwrite,
                                   bad=self._bad)
            counts["skipped_pages"] += written.skipped
            counts["healed_pages"] += written.healed
            counts["saved_pages"] += len(written.stored)
            counts["failed_saves"] += len(written.failed)
            if self.reports is not None:
                self.reports.after_write(job, [g for g, _ in pages], written.failed)
        except Exception as exc:  # noqa: BLE001 - a failed save is a later miss
            counts["failed_saves"] += 1
            logger.warning("radixlink save of %s failed: %s", job.req_id, exc)
        finally:
            for buffer in staging if frames is None else [*staging, frames]:
                self._arena.release(*buffer)  # NOTE: the store copied or wrote every page
            with self._lock:
                self._inflight_bytes -= num_bytes
                for name, value in counts.items():
                    self.stats[name] += value

    def _keys(self, job: PageJob, group_id: int, hashes: Sequence[str]) -> list[str]:
        return self._scheme.keys(self._layouts[group_id], hashes, self._rank, job.cache_salt)


def _by_block(tensor: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """A layer tensor with vLLM block ids on dimension 0 (kernel blocks grouped under them)."""
    if tensor.shape[0] == num_blocks:
        return tensor
    if tensor.shape[0] % num_blocks:
        raise ValueError(
            f"KV tensor of shape {tuple(tensor.shape)} does not split into {num_blocks} blocks"
        )
    return tensor.unflatten(0, (num_blocks, -1))
