"""``TransferEngine``: the one transfer engine of the page layer, under every adapter (the tree's
linker, SGLang's linker and HiCache backend, vLLM's workers). A job moves one batch of pages,
pool by pool, between staging frames (``pages.staging``) and the store, in stages::

    LOAD   get_into staging (one batch) -> verify every page -> land
           (``Job.land`` writes the verified payloads into the pools on the I/O thread; a job
           with no lander leaves them to its caller, staging held until ``release``)
    STREAM get_into a chunk's own staging -> verify it -> ``Stream.land`` it, on a verify
           thread while the next chunk is read (``pages.stream``; a load into host memory:
           bounded staging whatever the batch's size, faulted in ahead by ``reserve_stream``)
    SAVE   gather (the caller's, before ``submit``; or ``Job.fill`` on the I/O thread) ->
           encode in place -> skip the pages the store holds (``skip_present``) -> one put

One thread model: ``num_threads`` I/O threads run jobs from one FIFO queue (``submit``);
``run`` runs one on the caller's thread (HiCache's synchronous calls, and a save to an
in-process store with nothing to wait for). A load over ``CHUNK_BYTES`` is read chunk by chunk
and each chunk verified on as many verify threads (started by the first such load) while the
next one is read: the read's copy and a checksum or MAC pass run side by side, given a second
core (an I/O thread bound to one core, as vLLM's CPU worker is, checks in turn). One
corrupt-page policy (``pageio``: every bad page a counted miss, the present ones deleted and
remembered in ``bad``), one stats record (``stats``), one close budget (``CLOSE_BUDGET_S``).
Every job ends in exactly one ``Completion``, handed to the job's ``done`` on the thread that
ran it; nothing raises across threads (a failure is a status).

Owns threads, the queue, the staging a job holds and the job lifecycle. Must not touch the
tree or an engine's records: landers, fills and ``done`` callbacks are the adapters'.
"""

from __future__ import annotations

import enum
import functools
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from radixlink.pages import pageio, stream
from radixlink.pages.staging import StagingArena
from radixlink.pages.stream import Stream, chunk_bytes, one_core, settled
from radixlink.stores.base import Store

logger = logging.getLogger(__name__)

CLOSE_BUDGET_S = 2.0
"""How long ``close()`` lets queued and running jobs go on before it cancels the queued ones."""

class TransferKind(enum.Enum):
    """What a job does."""

    LOAD = "load"
    OFFLOAD = "offload"


class TransferStatus(enum.Enum):
    """How a job ended."""

    OK = "ok"
    MISSING = "missing"  # the store no longer holds a page (evicted since the lookup)
    CORRUPT = "corrupt"  # checksum, length, layout fingerprint or version mismatch
    STORE_ERROR = "store_error"
    CANCELLED = "cancelled"


_LOAD, _OFFLOAD = TransferKind.LOAD, TransferKind.OFFLOAD


class Landing(Protocol):
    """Where a load's verified pages go: the adapter's (pools, slots, what waits on them)."""

    def early(self) -> bool:
        """Whether to land before the verdict (asked once every page was read; the memory
        must stay private until the caller sees the verdict)."""

    def land(self, cancelled: Callable[[], bool]) -> bool:
        """Write the verified payloads, on an I/O thread; ``cancelled`` may be asked between
        layers. False when it stopped for a cancel."""

    def fail(self, done: Completion) -> None:
        """The load ended without landing: release whatever waits on it (must not raise)."""


@dataclass(slots=True, kw_only=True)
class Job:
    """One batch of pages to move.

    Attributes:
        kind: LOAD or OFFLOAD (a save).
        parts: per pool its codec, store keys and frames in ``staging`` (none for a
            ``stream``).
        staging: the buffer of the frames, given back to the engine's arena when the job ends
            (a LOAD with no lander: when its caller calls ``release``).
        ready: device events to wait for before the job touches device memory (its land or
            fill) or, for a save, reads its frames.
        land: LOAD: where the verified payloads go (``Landing``); None: the caller lands
            them from the frames once the job completed, then ``release``s the job.
        stream: LOAD: read and land chunk by chunk (``Stream``), instead of ``parts``.
        fill: OFFLOAD: copies the gathered pages into the frames, on the I/O thread.
        skip_present: OFFLOAD: pages the store holds are not sent (bad ones still are).
        done: called with the job's completion, on the thread that ran it; must not raise.
    """

    kind: TransferKind
    parts: Sequence[pageio.PageFrames]
    staging: tuple[Any, memoryview] | None = None
    ready: Sequence[Any] = ()
    land: Landing | None = None
    stream: Stream | None = None
    fill: Callable[[], None] | None = None
    skip_present: bool = False
    done: Callable[[Completion], None] | None = None

    @property
    def num_pages(self) -> int:
        if self.stream is not None:
            return self.stream.num_pages
        return sum(len(part.keys) for part in self.parts)


@dataclass(slots=True, kw_only=True)
class Completion:
    """How one job ended: its status, payload bytes moved, seconds, a detail in words, and
    what the read found (``read``: per page None or the reason it is not data) or the write
    did (``written``). ``cpu_seconds`` is the CPU time of the thread that ran it (a verify
    thread's not counted): ``seconds`` less it is the time that thread waited for a core or
    the GIL, or on the store."""

    job_id: int
    kind: TransferKind
    status: TransferStatus
    num_bytes: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    detail: str = ""
    read: pageio.ReadResult | None = None
    written: pageio.WriteResult | None = None

    @property
    def ok(self) -> bool:
        return self.status is TransferStatus.OK


STAT_NAMES = ("load_jobs", "offload_jobs", "failed_jobs", "cancelled_jobs", "fetched_pages",
              "bad_pages", "missing_pages", "saved_pages", "skipped_pages", "healed_pages",
              "failed_saves")


class TransferEngine:
    """I/O threads moving pages between staging and one store (see the module docstring).

    Args:
        store: the store every job talks to.
        num_threads: I/O threads (jobs run concurrently, completions may end out of order).
        arena: where staging comes from and goes back.
        name: the threads' name prefix.
    """

    def __init__(self, store: Store, num_threads: int = 2, arena: StagingArena | None = None,
                 name: str = "radixlink"):
        self.store = store
        self.arena = arena or StagingArena()
        self.bad = pageio.BadKeys()  # found bad here: lookups read them absent, saves rewrite
        self._stats: Counter[str] = Counter()
        self._jobs: queue.SimpleQueue[tuple[int, Job] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._cancelled: set[int] = set()
        self._running: dict[int, TransferKind] = {}  # job id -> kind, while a thread runs it
        self._pending = self._next_id = 0
        self._closed = False
        self._name = name
        self._verify: ThreadPoolExecutor | None = None
        self._threads = [threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True)
                         for i in range(max(1, num_threads))]
        for thread in self._threads:
            thread.start()

    # ---------------------------------------------------------------- jobs

    def submit(self, job: Job) -> int:
        """Queue ``job`` for the I/O threads; its id (ids increase in submission order).

        Raises:
            ValueError: the engine is closed.
        """
        job_id = self._open()
        if job.kind is _OFFLOAD and not job.ready and job.fill is None and self.store.in_process:
            # NOTE: a save with nothing to wait for to memory:// runs here: a thread handoff
            # added ~30% CPU per request on the tree workload and overlapped nothing
            self._guarded(job_id, job)
        else:
            self._jobs.put((job_id, job))
        return job_id

    def run(self, job: Job) -> Completion:
        """Run ``job`` on the caller's thread and return its completion (also handed to its
        ``done``)."""
        return self._guarded(self._open(), job)

    def reserve_stream(self, codecs: Sequence[pageio.PageCodec]) -> None:
        """Fault in the most staging a streamed load of these pools holds at once
        (``STREAM_WINDOW`` + 1 chunks; one on one core), so a fresh process's first load
        touches no new memory."""
        if not codecs:
            return
        nbytes, count = chunk_bytes(codecs), 1 if one_core() else stream.STREAM_WINDOW + 1
        if not self.arena.reserve(nbytes, count):
            logger.warning("radixlink could not reserve %d staging buffers of %d bytes; loads "
                           "will allocate theirs as they go", count, nbytes)

    def cancel(self, job_id: int) -> None:
        """Ask a job not to land (a load then completes as CANCELLED; its pages still count
        under the corrupt-page policy)."""
        self._cancelled.add(job_id)  # NOTE: set operations are atomic; read without a lock

    def release(self, job: Job) -> None:
        """Give the staging of a LOAD with no lander back (its caller landed its pages)."""
        if job.staging is not None:
            self.arena.release(*job.staging)
            job.staging = None

    # ---------------------------------------------------------------- state

    @property
    def pending(self) -> int:
        """Jobs queued or running."""
        with self._lock:
            return self._pending

    def stats(self) -> dict[str, int]:
        """The engine's counters (``STAT_NAMES``) and its arena's."""
        with self._lock:
            out = {name: self._stats[name] for name in STAT_NAMES}
        out.update(self.arena.stats())
        return out

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no job is queued or running; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending, timeout)

    def close(self, budget_s: float | None = CLOSE_BUDGET_S) -> None:
        """Stop taking jobs; queued ones still run, for at most ``budget_s`` (None: all of
        them, joining the threads). Idempotent.

        Past the budget the jobs still queued complete as CANCELLED without running, and only
        running loads are waited for (they write into memory their callers reserved);
        running saves go on in the background, their completions left to their callbacks,
        since a store call that hangs (a paused Redis) would cost its timeout per queued job.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for _ in self._threads:
            self._jobs.put(None)
        if budget_s is not None and not self.wait_idle(budget_s):
            self._cancel_queued()
            with self._idle:
                self._idle.wait_for(lambda: _LOAD not in self._running.values())
        else:
            for thread in self._threads:
                thread.join()
        if self._verify is not None:  # NOTE: no load runs now: nothing is left to verify
            self._verify.shutdown(wait=False)

    # ---------------------------------------------------------------- running a job

    def _open(self) -> int:
        with self._lock:
            if self._closed:
                raise ValueError("the transfer engine is closed; create a new one")
            job_id, self._next_id = self._next_id, self._next_id + 1
            self._pending += 1
        return job_id

    def _serve(self) -> None:
        while (item := self._jobs.get()) is not None:
            self._guarded(*item)

    def _guarded(self, job_id: int, job: Job) -> Completion:
        start, cpu = time.perf_counter(), time.thread_time()
        with self._lock:
            self._running[job_id] = job.kind
        try:
            done = self._load(job_id, job) if job.kind is _LOAD else self._save(job_id, job)
        except Exception as exc:  # noqa: BLE001 - a failure is a status, never a raise across threads
            done = Completion(job_id=job_id, kind=job.kind, status=TransferStatus.STORE_ERROR,
                              detail=f"{type(exc).__name__}: {exc}")
            if job.kind is _OFFLOAD:
                self._count(failed_saves=job.num_pages)
        done.seconds = time.perf_counter() - start
        done.cpu_seconds = time.thread_time() - cpu
        self._finish(job_id, job, done)
        return done

    def _finish(self, job_id: int, job: Job, done: Completion) -> None:
        """Give the job's staging back (a load with no lander keeps it), hand its completion
        over, and count it done."""
        if job.kind is _OFFLOAD or job.land is not None:
            self.release(job)
            if job.land is not None and done.status is not TransferStatus.OK:
                job.land.fail(done)
        self._count(**{f"{job.kind.value}_jobs": 1, "failed_jobs": int(not done.ok),
                       "cancelled_jobs": int(done.status is TransferStatus.CANCELLED)})
        if job.done is not None:
            try:
                job.done(done)
            except Exception:  # noqa: BLE001 - an adapter's bug must not stop the I/O thread
                logger.exception("radixlink: a transfer's completion callback failed")
        with self._idle:
            self._pending -= 1
            self._cancelled.discard(job_id)
            self._running.pop(job_id, None)
            self._idle.notify_all()

    def _load(self, job_id: int, job: Job) -> Completion:
        """Read every page, verify each, land them (``_read_staged`` or a ``Stream``); the
        verdict under the one corrupt-page policy."""
        cancelled = functools.partial(self._cancelled.__contains__, job_id)
        stopped = False
        if job.stream is not None:
            read = stream.read_streamed(job.stream, self.store, self.arena, self.bad,
                                        self._verifier)
        else:
            read, stopped = self._read_staged(job, cancelled)
        missing = read.num_missing()
        self._count(fetched_pages=len(read.reasons), bad_pages=len(read.bad_keys),
                    missing_pages=missing)
        status, detail = TransferStatus.OK, ""
        if not read.ok:
            misses = read.misses()
            status = TransferStatus.MISSING if missing else TransferStatus.CORRUPT
            short = not missing and set(misses) == {pageio.SHORT}
            detail = "short page" if short else f"{sum(misses.values())} bad page(s)"
        elif stopped:
            status = TransferStatus.CANCELLED
        return Completion(job_id=job_id, kind=_LOAD, status=status, detail=detail, read=read,
                          num_bytes=read.num_bytes if status is TransferStatus.OK else 0)

    def _read_staged(self, job: Job,
                     cancelled: Callable[[], bool]) -> tuple[pageio.ReadResult, bool]:
        """Read every page into the job's staging, verify each and land the batch if it is
        whole. A batch over ``CHUNK_BYTES`` is read chunk by chunk, each chunk verified on the
        verify threads while the next one is read. A landing that goes early (a layer-wise
        engine computes under it) lands before the verdict, so the copies overlap the engine's
        forward; its caller publishes only after the verdict. Also whether the job was
        cancelled before or while it landed."""
        landing = job.land
        pieces = pageio.chunks(job.parts, stream.CHUNK_BYTES)
        parallel = len(pieces) > 1 and not one_core()
        sizes: list[int | None] = []
        checks: list[stream.Check] = []  # NOTE: not parallel: checked here
        landed = None  # NOTE: not tried yet
        try:
            for piece in pieces:
                fetched = pageio.fetch(self.store, piece)
                sizes += fetched.sizes
                check = functools.partial(pageio.check, self.store, piece, fetched, bad=self.bad)
                checks.append(self._verifier().submit(check).result if parallel else check)
            if (landing is not None and None not in sizes and landing.early()
                    and not cancelled()):
                landed = self._land(job, cancelled)
        finally:  # NOTE: no verify thread may still read the staging this job gives back
            read = pageio.ReadResult.joined(settled(checks))
        if landing is None or not read.ok:
            return read, False
        if landed is None and not cancelled():
            landed = self._land(job, cancelled)
        return read, cancelled() or not landed

    def _verifier(self) -> ThreadPoolExecutor:
        """The verify threads, started with the first chunked load (most engines' loads
        fit one chunk and never start them)."""
        with self._lock:
            if self._verify is None:
                self._verify = ThreadPoolExecutor(len(self._threads),
                                                  thread_name_prefix=f"{self._name}-verify")
            return self._verify

    def _land(self, job: Job, cancelled: Callable[[], bool]) -> bool:
        for event in job.ready:  # NOTE: the memory's previous users are done with it
            event.synchronize()
        assert job.land is not None
        return job.land.land(cancelled)

    def _save(self, job_id: int, job: Job) -> Completion:
        """Fill the frames (after ``ready``), encode in place, skip what the store holds,
        one put. A ``skip_present`` job whose every page the store holds ends after the
        presence query: nothing gathered, encoded or sent."""
        for event in job.ready:
            event.synchronize()
        known = None
        if job.skip_present:
            known = [pageio.present(self.store, part.keys, self.bad) for part in job.parts]
            if all(map(all, known)):
                skipped = sum(map(len, known))
                self._count(skipped_pages=skipped)
                return Completion(job_id=job_id, kind=_OFFLOAD, status=TransferStatus.OK,
                                  written=pageio.WriteResult([], [], skipped=skipped))
        if job.fill is not None:
            job.fill()
        written = pageio.write(self.store, job.parts, skip_present=job.skip_present,
                               bad=self.bad, known=known)
        failed = len(written.failed)
        self._count(saved_pages=len(written.stored), skipped_pages=written.skipped,
                    healed_pages=written.healed, failed_saves=failed)
        return Completion(job_id=job_id, kind=_OFFLOAD, written=written,
                          status=TransferStatus.STORE_ERROR if failed else TransferStatus.OK,
                          num_bytes=sum(len(p.keys) * p.codec.frame_bytes for p in job.parts),
                          detail=f"{failed} page(s) not stored" if failed else "")

    def _cancel_queued(self) -> None:
        """Complete every queued job as CANCELLED, unrun (the threads' stop marks stay)."""
        stops = 0
        while True:
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                break
            if item is None:
                stops += 1
                continue
            job_id, job = item
            self._finish(job_id, job, Completion(job_id=job_id, kind=job.kind,
                                                 status=TransferStatus.CANCELLED,
                                                 detail="closed before it ran"))
        for _ in range(stops):
            self._jobs.put(None)

    def _count(self, **counts: int) -> None:
        with self._lock:
            self._stats.update(counts)
