"""The worker-side half of the connector: loads and saves between one TP rank's KV tensors and
the store, as jobs of the page layer's ``TransferEngine`` (its I/O threads, close budget, stats
and corrupt-page policy), with completions drained on the model runner's thread.

Owns the codecs, the in-flight save budget and the finished loads of one worker. Where a load's
pages land depends on where the KV lives:

- on the host (a CPU engine), each page is read straight into its block and verified there
  (from a store that ``scatters``), or each chunk of verified pages is copied into its blocks
  on the thread that checked it, while the next chunk is read (``ChunkLanding``): vLLM gives a
  loading request's blocks to no one else and runs nothing on them until the load is reported
  finished, so the writes need no ordering with the model;
- on a device, writes happen only on the model runner's thread (``transfer_results``), ordered
  with the model's own kernels: the verified frames wait in staging for the scatter.

Never raises across threads: a failed load is a load error.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from radixlink.integrations.vllm.keys import GroupLayout, KeyScheme
from radixlink.integrations.vllm.loads import FetchedBatch, LoadPlan, RequestLoad
from radixlink.integrations.vllm.metadata import GroupPages, PageJob
from radixlink.integrations.vllm.pages import PagedGroup
from radixlink.integrations.vllm.reports import WorkerReports
from radixlink.pages import pageio
from radixlink.pages.engine import Completion, Job, TransferEngine, TransferKind
from radixlink.pages.staging import StagingArena
from radixlink.pages.stream import Stream
from radixlink.stores.base import Store

logger = logging.getLogger(__name__)

STAT_NAMES = (
    "loaded_pages", "fetched_pages", "bad_pages", "healed_pages", "saved_pages",
    "skipped_pages", "dropped_saves", "failed_loads", "failed_saves",
)  # fmt: skip
_ENGINE_STATS = ("fetched_pages", "bad_pages", "healed_pages", "saved_pages", "skipped_pages",
                 "failed_saves")  # NOTE: the engine's counters of the same names and meaning


class WorkerSide:
    """Loads and saves of one worker (one TP rank).

    A step's loads are one batch: each distinct page key is read from the store once, however
    many requests of the step share it, and scattered into each request's own blocks (vLLM
    does not share device blocks between requests still loading). Every bad page of a batch
    (missing, corrupt, foreign key, truncated, wrong layout, unsealed) is counted with its
    reason; the present ones are deleted from the store and overwritten by the next save of
    their recomputed pages (the heal), so a damaged store is mended in one pass: the one
    corrupt-page policy of ``pages.pageio``, run by the worker's ``TransferEngine``.

    Args:
        layouts: the groups taking part (same list as the scheduler side).
        scheme: key naming shared with the scheduler.
        store: the page store (owned: closed by ``close``).
        tp_rank: this worker's tensor-parallel rank (part of every key and fingerprint).
        num_threads: store I/O threads (the engine's).
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
        self._engine = TransferEngine(
            store, num_threads, name="radixlink-vllm",
            arena=StagingArena(max_cached_bytes=min(max_inflight_save_bytes, 256 << 20)))
        self._done: queue.Queue[FetchedBatch] = queue.Queue()
        self._lock = threading.Lock()
        self._inflight_bytes = 0
        self._finished_sending: set[str] = set()
        self._load_errors: set[int] = set()
        self._kv_caches: Mapping[str, torch.Tensor] = {}
        self._num_blocks = 0
        self._counts = dict.fromkeys(STAT_NAMES, 0)  # the worker's own; see ``stats``
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
        arena = self._engine.arena
        if any(g.device.type == "cuda" for g in groups.values()) and not arena.pinned:
            # NOTE: before any job (register precedes the first step): no staging is out
            self._engine.arena = StagingArena(pinned=True, max_cached_bytes=arena.max_cached_bytes)
        elif all(g.device.type == "cpu" for g in groups.values()):
            self._engine.reserve_stream(list(self._codecs.values()))

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
            batch.release(self._engine)
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
        """Queue this step's loads as one LOAD job of the engine (store reads and verify on
        its I/O threads): each distinct page once, into staging held until the job's pages
        landed: chunk by chunk on those threads for host KV, else by ``transfer_results``."""
        if not jobs:
            return
        plan = LoadPlan.of(jobs, list(self._codecs), self._keys)
        if not plan.keys:
            self._done.put(plan.split(None, None))
            return
        landing = None
        if self._groups and all(g.device.type == "cpu" for g in self._groups.values()):
            landing = ChunkLanding(self._groups, plan)
            job = Job(kind=TransferKind.LOAD, parts=(),
                      stream=Stream(plan.pools(self._codecs), landing.land, landing.targets))
        else:
            try:
                staging, parts = pageio.stage_pages(self._engine.arena,
                                                    plan.pools(self._codecs))
            except Exception as exc:  # noqa: BLE001 - no staging: every load fails, none raises
                self._done.put(plan.failed(f"{type(exc).__name__}: {exc}"))
                return
            job = Job(kind=TransferKind.LOAD, parts=parts, staging=staging)
        job.done = functools.partial(self._loaded, plan, job, landing)
        try:
            self._engine.submit(job)
        except ValueError as exc:  # NOTE: closed: the staging goes back, the loads fail
            self._engine.release(job)
            self._done.put(plan.failed(str(exc)))

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
            if not groups:
                continue
            with self._lock:
                if self._inflight_bytes + num_bytes > self._max_inflight:
                    self._counts["dropped_saves"] += 1
                    continue
                self._inflight_bytes += num_bytes
            self._submit_save(job, groups, sizes)

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
            self._finish_batch(batch)  # NOTE: first: a scatter that fails fails its load
            for load in batch.requests:
                recving.add(load.req_id)
                if load.failed and not self._block_errors:
                    failed.add(load.req_id)
        sending, self._finished_sending = self._finished_sending, set()
        return sending, recving, failed

    @property
    def stats(self) -> dict[str, int]:
        """Every ``STAT_NAMES`` counter since the start: the engine's reads, verdicts and
        writes (``fetched_pages``, ``bad_pages``, ``saved_pages``, ``skipped_pages``,
        ``healed_pages``, ``failed_saves``) and the worker's scatters and drops."""
        counted = self._engine.stats()
        with self._lock:
            out = dict(self._counts)
        for name in _ENGINE_STATS:
            out[name] += counted[name]
        return out

    def staging_stats(self) -> dict[str, int]:
        """The staging buffers of loads and saves: ``staging_allocs``, ``staging_reuses``,
        ``staging_cached_bytes``."""
        return self._engine.arena.stats()

    def store_stats(self) -> dict[str, Any]:
        """This worker's store's own counters (``hits``, ``misses``, ``puts`` ...)."""
        return self._store.stats()

    def take_stats(self) -> dict[str, int]:
        """``stats`` counted since the last call (only the nonzero ones): the per-interval
        payload of vLLM's connector stats."""
        now = self.stats
        delta = {name: now[name] - self._reported[name] for name in STAT_NAMES}
        self._reported = now
        return {name: value for name, value in delta.items() if value}

    def take_load_errors(self) -> set[int]:
        """Block ids whose load failed since the last call (one-group layouts only)."""
        errors, self._load_errors = self._load_errors, set()
        return errors

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until no load or save is queued or running; False on timeout."""
        return self._engine.wait_idle(timeout)

    def close(self) -> None:
        """Finish queued transfers within the engine's ``CLOSE_BUDGET_S`` (then cancel the
        queued ones), stop its threads and close the store. Idempotent."""
        self._engine.close()
        self._store.close()

    def _finish_batch(self, batch: FetchedBatch) -> None:
        """Scatter each request's verified pages (skipped for a request vLLM recomputes
        whole, and for a batch landed during its read), log each failed load once, then give
        the staging back. One INFO line per batch that loaded pages: how long the read and
        verify (with the landing in it) took, the wait for this thread, and the scatter here
        (``bench vllm`` reads it)."""
        start, pages, nbytes = time.perf_counter(), 0, 0
        try:
            for load in batch.requests:
                if load.failed:
                    self._fail(load)
                    if not self._block_errors:
                        continue
                try:
                    for gid, block_ids, rows in load.pages:
                        group = self._groups[gid]
                        if not batch.landed:
                            group.scatter(block_ids, batch.payloads[gid], rows)
                        pages += len(block_ids)
                        nbytes += len(block_ids) * group.page_bytes
                except Exception as exc:  # noqa: BLE001 - never into vLLM's worker: the load
                    load.error = f"scatter failed: {type(exc).__name__}: {exc}"  # fails
                    load.bad_blocks.update(b for _, ids, _ in load.pages for b in ids)
                    self._fail(load)
                self._load_errors |= load.bad_blocks
        finally:
            batch.release(self._engine)
        if pages:
            with self._lock:
                self._counts["loaded_pages"] += pages
            logger.info("radixlink load batch: %d pages, %d bytes; read and verified in %.4f s "
                        "(%.4f s of copies into the blocks during it), waited %.4f s for the "
                        "model runner, scattered in %.4f s", pages, nbytes, batch.read_s,
                        batch.landed_s, start - batch.done_at, time.perf_counter() - start)

    def _fail(self, load: RequestLoad) -> None:
        with self._lock:
            self._counts["failed_loads"] += 1
        kept = sum(len(block_ids) for _, block_ids, _ in load.pages) if self._block_errors else 0
        logger.warning("radixlink load of request %s failed: %s; %d verified leading pages "
                       "kept, the rest is recomputed", load.req_id, load.describe(), kept)

    def _loaded(self, plan: LoadPlan, job: Job, landing: ChunkLanding | None,
                done: Completion) -> None:
        """A LOAD job completed (I/O thread): split its verdict per request, report it, and
        queue it for ``transfer_results`` (its staging stays held until then). Total: a
        failure here fails every load of the step (vLLM recomputes them) rather than leave them
        unfinished."""
        try:
            batch = plan.split(job, done)
            if landing is not None and done.read is not None:
                batch.landed, batch.landed_s = True, sum(landing.seconds)
            if done.read is not None and self.reports is not None:
                self.reports.after_read(plan.jobs, batch)
        except Exception as exc:  # noqa: BLE001 - on the I/O thread: the loads must still end
            logger.exception("radixlink: splitting a load's verdict failed; its loads fail")
            self._engine.release(job)
            batch = plan.failed(f"{type(exc).__name__}: {exc}")
        self._done.put(batch)

    def _submit_save(self, job: PageJob, groups: list[GroupPages], sizes: list[int]) -> None:
        """Copy the pages out now (the blocks may be reused after this step) into reused
        staging, then queue an OFFLOAD job whose ``fill`` copies them into its frames on an
        I/O thread (encode in place, skip the present pages unless ``job.overwrite``: pages
        past a failed load were never verified)."""
        arena = self._engine.arena
        raw = [arena.acquire(size) for size in sizes]
        try:
            pages = [self._groups[g.group_id].gather(g.block_ids, buf[:size])
                     for g, size, (buf, _) in zip(groups, sizes, raw, strict=True)]
            staging, parts = pageio.stage_pages(arena, [
                (self._codecs[g.group_id], self._keys(job, g.group_id, g.hashes))
                for g in groups])  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - never into vLLM's worker: a dropped save
            self._saved(job, groups, sum(sizes), raw, None)  # is a later miss
            logger.warning("radixlink save of %s dropped: %s: %s", job.req_id,
                           type(exc).__name__, exc)
            return
        save = Job(kind=TransferKind.OFFLOAD, parts=parts, staging=staging,
                   fill=functools.partial(_fill, parts, pages), skip_present=not job.overwrite,
                   done=functools.partial(self._saved, job, groups, sum(sizes), raw))
        try:
            self._engine.submit(save)
        except ValueError as exc:  # NOTE: closed: a dropped save is a later miss
            self._engine.release(save)
            self._saved(job, groups, sum(sizes), raw, None)
            logger.warning("radixlink save of %s dropped: %s", job.req_id, exc)

    def _saved(self, job: PageJob, groups: list[GroupPages], num_bytes: int,
               raw: list[tuple[torch.Tensor, memoryview]], done: Completion | None) -> None:
        """A save ended (``done`` None: it never ran): the gathered pages' staging goes back
        and its bytes leave the in-flight budget."""
        for buffer in raw:
            self._engine.arena.release(*buffer)
        with self._lock:
            self._inflight_bytes -= num_bytes
        if done is None:
            return
        if done.written is not None:
            if self.reports is not None:
                self.reports.after_write(job, groups, done.written.failed)
        elif not done.ok:
            logger.warning("radixlink save of %s failed: %s", job.req_id, done.detail)

    def _keys(self, job: PageJob, group_id: int, hashes: Sequence[str]) -> list[str]:
        return self._scheme.keys(self._layouts[group_id], hashes, self._rank, job.cache_salt)


class ChunkLanding:
    """Where a streamed load's pages go on host KV (see the module docstring): each page read
    straight into its block (``targets``: one copy, from a store that ``scatters``), where a
    page lands in one block only; else each verified chunk copied into its blocks on the
    thread that checked it (``land``). A bad page is not copied from staging, but read
    straight in, it has written its block; either way the split reports the block bad (vLLM
    recomputes it, and gives a loading request's blocks to no one else).

    Args:
        groups: the worker's groups by id.
        plan: the batch's plan (which row lands in which blocks; its pools are the stream's).
    """

    def __init__(self, groups: Mapping[int, PagedGroup], plan: LoadPlan):
        by_row = plan.blocks_by_row()
        self._targets = [(groups[gid], by_row[gid]) for gid in plan.keys]
        self.seconds: list[float] = []  # NOTE: appended from several verify threads

    def targets(self, span: pageio.Span) -> list[tuple[memoryview, ...]] | None:
        """Per page of ``span`` the views of its one block (``PagedGroup.payload_views``), or
        None (a page lands in several requests' blocks, or the layout has no such views: the
        chunk goes through staging)."""
        pool, first, count = span
        group, by_row = self._targets[pool]
        blocks = by_row[first : first + count]
        if any(len(b) != 1 for b in blocks):
            return None
        return group.payload_views([b[0] for b in blocks])

    def land(self, spans: Sequence[pageio.Span], piece: Sequence[pageio.PageFrames],
             read: pageio.ReadResult) -> None:
        start, page = time.perf_counter(), 0
        for (pool, first, count), part in zip(spans, piece, strict=True):
            group, by_row = self._targets[pool]
            blocks, rows = [], []
            for row in range(count):
                if read.reasons[page + row] is None:
                    blocks += by_row[first + row]
                    rows += [row] * len(by_row[first + row])
            page += count
            if blocks:
                group.scatter(blocks, part.frames.payloads(), rows)
        self.seconds.append(time.perf_counter() - start)


def _by_block(tensor: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """A layer tensor with vLLM block ids on dimension 0 (kernel blocks grouped under them)."""
    if tensor.shape[0] == num_blocks:
        return tensor
    if tensor.shape[0] % num_blocks:
        raise ValueError(
            f"KV tensor of shape {tuple(tensor.shape)} does not split into {num_blocks} blocks"
        )
    return tensor.unflatten(0, (num_blocks, -1))


def _fill(parts: Sequence[pageio.PageFrames], pages: Sequence[torch.Tensor]) -> None:
    """Copy gathered pages into the frames' payloads (an OFFLOAD job's ``fill``)."""
    for part, data in zip(parts, pages, strict=True):
        part.frames.payloads().copy_(data)
