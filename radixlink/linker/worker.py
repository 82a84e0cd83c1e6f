"""Background store I/O for the linker: load jobs (get into staging, verify, land in reserved
slots layer by layer) and offload jobs (encode in place, one put). Completions are records
drained by the linker on the caller's thread.

Owns threads and the completion queue; tells each load's ``LayerProgress`` what landed. Must
not touch the tree:
it only writes pool slots that a load reserved for it, and it never raises across threads
(failures are a status).
"""

from __future__ import annotations

import enum
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from radixlink.contract import PoolName
from radixlink.linker.progress import LayerProgress
from radixlink.memory.host import StagingArena
from radixlink.stores import pageio
from radixlink.stores.base import Store


class TransferKind(enum.Enum):
    """What a background transfer does."""

    LOAD = "load"
    OFFLOAD = "offload"


class TransferStatus(enum.Enum):
    """How a background transfer ended."""

    OK = "ok"
    MISSING = "missing"  # the store no longer holds a page (evicted since LOOKUP)
    CORRUPT = "corrupt"  # checksum, length, layout fingerprint or version mismatch
    STORE_ERROR = "store_error"
    CANCELLED = "cancelled"


_LOAD, _OFFLOAD = TransferKind.LOAD, TransferKind.OFFLOAD


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolPages(pageio.PageFrames):
    """One pool's part of a transfer: its store keys, codec and frames in the job's staging
    (a ``pageio.PageFrames``, which reads and writes them).

    Loads also name where the verified payloads land: ``land(layer)`` writes that layer (or,
    with ``layer=None``, everything) from the frames' payloads into the reserved slots;
    ``num_layers`` is 0 for pools that land whole (Mamba states) before layer 0.
    """

    name: PoolName
    land: Callable[[int | None], None] | None = None
    num_layers: int = 0


@dataclass(slots=True, kw_only=True)
class Job:
    """A transfer: its pools, the staging buffer they live in (released when it ends) and, on
    CUDA, the event its offload gather recorded (``ready``) or the stream its load lands on."""

    kind: TransferKind
    pools: Sequence[PoolPages]
    staging: tuple[torch.Tensor, memoryview] | None = None
    ready: Any = None
    stream: Any = None
    progress: LayerProgress | None = None

    @property
    def num_pages(self) -> int:
        return sum(len(pool.keys) for pool in self.pools)


@dataclass(slots=True, kw_only=True)
class Completion:
    """One finished background transfer."""

    job_id: int
    kind: TransferKind
    status: TransferStatus
    num_bytes: int = 0
    seconds: float = 0.0
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status is TransferStatus.OK


_STOP = None


class TransferWorker:
    """A few threads running store transfers from one queue; completions go to another.

    Args:
        store: the store every job talks to.
        num_threads: concurrent transfers.
        arena: where staging buffers go back after their job.
    """

    def __init__(self, store: Store, num_threads: int = 2, arena: StagingArena | None = None):
        self.store = store
        self.arena = arena or StagingArena()
        self._jobs: queue.SimpleQueue[tuple[int, Job] | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[Completion] = queue.SimpleQueue()
        self._cancelled: set[int] = set()
        self._running: dict[int, TransferKind] = {}  # job id -> kind, while a thread runs it
        self._lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._next_id = 0
        self._closed = False
        self._threads = [threading.Thread(target=self._serve, name=f"radixlink-{i}",
                                          daemon=True)
                         for i in range(max(1, num_threads))]
        for thread in self._threads:
            thread.start()

    def submit(self, job: Job) -> int:
        """Queue a job; returns its id (ids increase in submission order).

        LOAD: one ``get_into`` of every pool's keys into the staging frames, verify every
        page, then land them in the reserved slots layer by layer. OFFLOAD: encode every
        frame in place (its payload was gathered into staging), one ``put``. An offload to
        an ``in_process`` store whose pages are already in host staging (no CUDA event to
        wait for) runs here, on the caller's thread, before ``submit`` returns; its
        completion is drained like any other.

        Raises:
            ValueError: the worker is closed.
        """
        with self._lock:
            if self._closed:
                raise ValueError("the linker's transfer worker is closed; create a new linker")
            job_id = self._next_id
            self._next_id += 1
            self._pending += 1
        if job.kind is _OFFLOAD and job.ready is None and self.store.in_process:
            # NOTE: measured on the tree workload (memory://, 2 cores): the worker thread
            # added ~30% CPU per request (GIL hand-offs, wake-ups) and overlapped nothing
            self._guarded(job_id, job)
        else:
            self._jobs.put((job_id, job))
        return job_id

    def cancel(self, job_id: int) -> None:
        """Ask a queued load not to write; it completes as CANCELLED (its slots stay reserved
        until that completion is drained, so no write can land in freed memory)."""
        with self._lock:
            self._cancelled.add(job_id)

    def drain(self, block_for: float | None = None) -> list[Completion]:
        """Every completion available now; with ``block_for``, wait that long for the first."""
        out: list[Completion] = []
        if block_for is None and self._done.empty():  # NOTE: the common case, no exception
            return out
        try:
            if block_for is not None:
                out.append(self._done.get(timeout=block_for))
            while True:
                out.append(self._done.get_nowait())
        except queue.Empty:
            pass
        return out

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no job is running or queued; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self, budget_s: float | None = None) -> None:
        """Stop accepting jobs; queued jobs still run, for at most ``budget_s`` (None: all of
        them, joining the threads).

        Past the budget the jobs still queued complete as CANCELLED without running, and
        only running loads are waited for (they write slots reserved for them); running
        offloads go on in the background, their completions left unread, since a store
        call that hangs (a paused Redis) would otherwise cost its timeout per queued job.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for _ in self._threads:
            self._jobs.put(_STOP)
        if budget_s is not None and not self.wait_idle(budget_s):
            self._cancel_queued()
            with self._idle:
                while _LOAD in self._running.values():
                    self._idle.wait()
            return
        for thread in self._threads:
            thread.join()

    def _cancel_queued(self) -> None:
        """Complete every queued job as CANCELLED, unrun (the threads' stop marks stay)."""
        stops = 0
        while True:
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                stops += 1
                continue
            job_id, job = item
            self._finish(job_id, job, Completion(job_id=job_id, kind=job.kind,
                                                 status=TransferStatus.CANCELLED,
                                                 detail="closed before it ran"))
        for _ in range(stops):
            self._jobs.put(_STOP)

    def _serve(self) -> None:
        while True:
            item = self._jobs.get()
            if item is _STOP:
                return
            self._guarded(*item)

    def _guarded(self, job_id: int, job: Job) -> None:
        start = time.perf_counter()
        with self._lock:
            self._running[job_id] = job.kind
        try:
            done = self._run_load(job_id, job) if job.kind is _LOAD else self._run_offload(
                job_id, job)
        except Exception as exc:  # noqa: BLE001 - a failure is a status, never a raise across threads
            done = Completion(job_id=job_id, kind=job.kind, status=TransferStatus.STORE_ERROR,
                              detail=f"{type(exc).__name__}: {exc}")
        done.seconds = time.perf_counter() - start
        self._finish(job_id, job, done)

    def _finish(self, job_id: int, job: Job, done: Completion) -> None:
        """Release the job's staging, publish its completion, and count it done."""
        if job.staging is not None:
            self.arena.release(*job.staging)
        if job.progress is not None and not done.ok:
            job.progress.fail()
        self._done.put(done)
        with self._idle:
            self._pending -= 1
            self._cancelled.discard(job_id)
            self._running.pop(job_id, None)
            self._idle.notify_all()

    def _is_cancelled(self, job_id: int) -> bool:
        with self._lock:
            return job_id in self._cancelled

    def _run_load(self, job_id: int, job: Job) -> Completion:
        """Read every page into staging, verify each, land them in the reserved slots.

        A watched load (a layer-wise engine computes under it) lands its layers *before* the
        pages are verified, so the copies overlap the engine's forward; the slots are private
        until publish, which still comes only after every page verified (a failure then
        fails the load and the engine drops what it computed)."""
        parts = job.pools
        fetched = pageio.fetch(self.store, parts)
        early = (job.progress is not None and job.progress.watched
                 and None not in fetched.sizes and not self._is_cancelled(job_id))
        landed = self._land(job_id, job) if early else False
        # NOTE: the one corrupt-page policy: every bad page counted, the present ones deleted
        read = pageio.check(self.store, parts, fetched)
        if not read.ok:
            missing = read.num_missing()
            status = TransferStatus.MISSING if missing else TransferStatus.CORRUPT
            misses = read.misses()
            if not missing and set(misses) == {pageio.SHORT}:
                return Completion(job_id=job_id, kind=_LOAD, status=status,
                                  detail="short page", extra={"misses": misses})
            return Completion(job_id=job_id, kind=_LOAD, status=status,
                              detail=f"{sum(misses.values())} bad page(s)",
                              extra={"misses": misses, "bad_keys": read.bad_keys})
        if self._is_cancelled(job_id) or not (landed or (not early and self._land(job_id, job))):
            return Completion(job_id=job_id, kind=_LOAD, status=TransferStatus.CANCELLED)
        return Completion(job_id=job_id, kind=_LOAD, status=TransferStatus.OK,
                          num_bytes=read.num_bytes)

    def _land(self, job_id: int, job: Job) -> bool:
        """Write the verified pages into the reserved slots: whole pools (states) first, then
        layer by layer, telling ``job.progress`` after each; False when cancelled between
        layers. On CUDA the copies run on ``job.stream`` and the job ends after they finish."""
        stream = job.stream
        if stream is None:
            return self._land_layers(job_id, job, None)
        with torch.cuda.stream(stream):  # type: ignore[attr-defined]
            landed = self._land_layers(job_id, job, stream)
        stream.synchronize()  # NOTE: publish (on the engine thread) follows this completion
        return landed

    def _land_layers(self, job_id: int, job: Job, stream: Any) -> bool:
        progress = job.progress
        per_layer = progress is not None and progress.watched
        layered = []
        for pool in job.pools:
            if pool.num_layers and per_layer:
                layered.append(pool)
                continue
            assert pool.land is not None, "a load job needs a writer per pool"
            pool.land(None)
            if progress is not None:
                progress.land(pool.name, None, None if stream is None else _record(stream))
        num_layers = max([pool.num_layers for pool in layered]) if layered else 0
        for layer in range(num_layers):
            if layer and self._is_cancelled(job_id):
                return False
            for pool in layered:
                if layer < pool.num_layers:
                    assert pool.land is not None, "a load job needs a writer per pool"
                    pool.land(layer)
                    if progress is not None:
                        progress.land(pool.name, layer, _record(stream))
        return True

    def _run_offload(self, job_id: int, job: Job) -> Completion:
        """Encode every frame in place and write them all with one ``put``."""
        if job.ready is not None:
            job.ready.synchronize()  # the device-to-host gather has landed in staging
        written = pageio.write(self.store, job.pools)
        num_bytes = 0
        for pool in job.pools:
            num_bytes += len(pool.keys) * pool.codec.frame_bytes
        failed = len(written.failed)
        return Completion(job_id=job_id, kind=_OFFLOAD,
                          status=TransferStatus.STORE_ERROR if failed else TransferStatus.OK,
                          num_bytes=num_bytes,
                          detail=f"{failed} page(s) not stored" if failed else "")


def _record(stream: Any) -> Any:
    """A CUDA event recorded on ``stream`` now, or None on CPU."""
    if stream is None:
        return None
    event = torch.cuda.Event()  # type: ignore[attr-defined]
    event.record(stream)
    return event
