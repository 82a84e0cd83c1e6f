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
from dataclasses import dataclass, field
from typing import Any

import torch

from radixlink.integrations.vllm.keys import GroupLayout, KeyScheme
from radixlink.integrations.vllm.metadata import GroupPages, PageJob
from radixlink.integrations.vllm.pages import PagedGroup
from radixlink.memory.host import StagingArena
from radixlink.stores.base import Store
from radixlink.stores.codec import PageCodec

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _LoadDone:
    """A finished load: verified leading pages per group, and the block ids that failed."""

    req_id: str
    pages: list[tuple[int, tuple[int, ...], torch.Tensor]] = field(default_factory=list)
    bad_blocks: set[int] = field(default_factory=set)
    failed: bool = False


class WorkerSide:
    """Loads and saves of one worker (one TP rank).

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
    """

    def __init__(self, *, layouts: Sequence[GroupLayout], scheme: KeyScheme, store: Store,
                 tp_rank: int, num_threads: int, max_inflight_save_bytes: int,
                 block_errors: bool):  # fmt: skip
        self._layouts = {g.group_id: g for g in layouts}
        self._scheme = scheme
        self._store = store
        self._rank = tp_rank
        self._block_errors = block_errors
        self._max_inflight = max_inflight_save_bytes
        self._groups: dict[int, PagedGroup] = {}
        self._codecs: dict[int, PageCodec] = {}
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="radixlink-vllm")
        self._done: queue.Queue[_LoadDone] = queue.Queue()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self._inflight_bytes = 0
        self._finished_sending: set[str] = set()
        self._load_errors: set[int] = set()
        self.stats = {"loaded_pages": 0, "saved_pages": 0, "skipped_pages": 0,
                      "dropped_saves": 0, "failed_loads": 0, "failed_saves": 0}  # fmt: skip

    def register(self, kv_caches: Mapping[str, torch.Tensor], num_blocks: int) -> None:
        """Bind every group to its layers' tensors and build its codec.

        Raises:
            ValueError: a layer of a taking-part group is missing from ``kv_caches``.
        """
        for gid, layout in self._layouts.items():
            missing = [n for n in layout.layer_names if n not in kv_caches]
            if missing:
                raise ValueError(
                    f"RadixlinkConnector: register_kv_caches lacks layers {missing[:4]} of KV "
                    f"cache group {gid}; got {sorted(kv_caches)[:8]}"
                )
            tensors = [_by_block(kv_caches[n], num_blocks) for n in layout.layer_names]
            group = PagedGroup(tensors)
            self._groups[gid] = group
            fingerprint = (f"{self._scheme.model}|{layout.description}|rank{self._rank}|"
                           f"{group.order}|{group.page_bytes}")  # fmt: skip
            self._codecs[gid] = PageCodec(fingerprint, group.page_bytes,
                                          secret=self._store.page_secret)
        on_cuda = any(g.device.type == "cuda" for g in self._groups.values())
        self._arena = StagingArena(pinned=on_cuda,
                                   max_cached_bytes=min(self._max_inflight, 256 << 20))

    def start_loads(self, jobs: Sequence[PageJob]) -> None:
        """Queue each load on the I/O threads (store get + verify; no device writes)."""
        for job in jobs:
            self._submit(self._load, job)

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
                done = self._done.get_nowait()
            except queue.Empty:
                break
            recving.add(done.req_id)
            bad = done.failed or bool(done.bad_blocks)
            if bad:
                with self._lock:
                    self.stats["failed_loads"] += 1
            if bad and not self._block_errors:
                failed.add(done.req_id)
                continue
            for gid, block_ids, pages in done.pages:
                self._groups[gid].scatter(block_ids, pages)
                self.stats["loaded_pages"] += len(block_ids)
            self._load_errors |= done.bad_blocks
        sending, self._finished_sending = self._finished_sending, set()
        return sending, recving, failed

    def staging_stats(self) -> dict[str, int]:
        """The save staging buffers: ``staging_allocs``, ``staging_reuses``,
        ``staging_cached_bytes``."""
        return self._arena.stats()

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

    def _load(self, job: PageJob) -> None:
        done = _LoadDone(req_id=job.req_id)
        try:
            self._fetch(job, done)
        except Exception as exc:  # noqa: BLE001 - store died, timeouts: the whole load fails
            logger.warning("radixlink load of %s failed: %s", job.req_id, exc)
            done.failed = True
            done.pages.clear()
            done.bad_blocks = {b for g in job.groups for b in g.block_ids}
        self._done.put(done)

    def _fetch(self, job: PageJob, done: _LoadDone) -> None:
        """One batched get; each group keeps its verified leading pages, the rest is bad."""
        keys = {g.group_id: self._keys(job, g.group_id, g.hashes) for g in job.groups}
        flat = [k for g in job.groups for k in keys[g.group_id]]
        blobs = self._store.get(flat)
        pos, corrupt = 0, []
        for g in job.groups:
            codec, group = self._codecs[g.group_id], self._groups[g.group_id]
            good: list[memoryview] = []
            for key, blob in zip(keys[g.group_id], blobs[pos : pos + len(g.block_ids)]):
                view = codec.decode(blob, key)
                if view is None or view.nbytes != group.page_bytes:
                    corrupt += [key] if blob is not None else []
                    break
                good.append(view)
            pos += len(g.block_ids)
            n = len(good)
            done.bad_blocks.update(g.block_ids[n:])
            if n:
                pages = torch.frombuffer(bytearray(b"".join(good)), dtype=torch.uint8)
                done.pages.append((g.group_id, g.block_ids[:n], pages.view(n, -1)))
        if corrupt:  # NOTE: heal: a recomputed page is saved again only if its key is gone
            self._store.delete(corrupt)

    def _put(self, job: PageJob, pages: list[tuple[GroupPages, torch.Tensor]],
             num_bytes: int, staging: list[tuple[torch.Tensor, memoryview]]) -> None:
        counts = {"saved_pages": 0, "skipped_pages": 0, "failed_saves": 0}
        try:
            items: dict[str, bytes] = {}
            for g, data in pages:
                keys = self._keys(job, g.group_id, g.hashes)
                # NOTE: one presence batch first: pages another instance (or an earlier
                # request) stored are not encoded or sent again.
                exists = self._store.exists(keys)
                codec = self._codecs[g.group_id]
                for i, (key, there) in enumerate(zip(keys, exists)):
                    if not there:
                        items[key] = codec.encode(data[i], key)
                counts["skipped_pages"] += sum(exists)
            results = self._store.put(items) if items else []
            counts["saved_pages"] += sum(results)
            counts["failed_saves"] += len(results) - sum(results)
        except Exception as exc:  # noqa: BLE001 - a failed save is a later miss
            counts["failed_saves"] += 1
            logger.warning("radixlink save of %s failed: %s", job.req_id, exc)
        finally:
            for buffer in staging:  # NOTE: every encode copied out of it (codec.encode)
                self._arena.release(*buffer)
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
