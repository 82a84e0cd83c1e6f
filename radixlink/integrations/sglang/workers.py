"""What SGLang's linker contract needs on top of the page layer's ``TransferEngine``: the
load batches' bookkeeping (``LoadBatches``), a load's landing into SGLang's pools (on a device
layer by layer, ``LayerLanding``; on CPU chunk by chunk as it is read, ``ChunkLanding``), the
in-order offload verdicts (``InOrder``), and the jobs (``load_job``, ``offload_job``).

Owns the completion records and how a verified batch lands. Threads, staging, the corrupt-page
policy and the stats are the engine's (``pages.engine``). A failure is a status (a failed
layer counter, a False offload), never an exception across threads. Must not import SGLang or
touch its tree: loads write only the slots the tree reserved for them.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from radixlink.integrations.sglang.device_pools import PoolView
from radixlink.pages import pageio
from radixlink.pages.engine import Completion, Job, TransferKind, TransferStatus
from radixlink.pages.staging import StagingArena
from radixlink.pages.stream import Stream

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class PageMove:
    """One pool's pages of one request: store keys and the device slots they map to."""

    view: PoolView
    codec: pageio.Codec
    keys: list[str]
    slots: torch.Tensor


class PageLoadError(RuntimeError):
    """A load batch could not be restored (missing, corrupt or unreadable pages)."""


class LoadBatches:
    """Which requests each load batch holds, and which batches have ended (landed or failed),
    oldest first. Bounded by the caller: a batch leaves on ``pop_ended`` (SGLang's newer
    completion polling) or ``forget`` (SGLang 0.5.23's ``finish_layer_wise_loading``)."""

    def __init__(self) -> None:
        self._rids: dict[int, list[str]] = {}
        self._ended: collections.deque[int] = collections.deque()
        self._lock = threading.Lock()  # NOTE: ``ended`` runs on an I/O thread

    def started(self, index: int, rids: list[str]) -> None:
        with self._lock:
            self._rids[index] = rids

    def ended(self, index: int) -> None:
        with self._lock:
            if index in self._rids and index not in self._ended:
                self._ended.append(index)

    def num_ended(self) -> int:
        with self._lock:
            return len(self._ended)

    def pop_ended(self) -> list[str]:
        with self._lock:
            if not self._ended:
                return []
            return self._rids.pop(self._ended.popleft(), [])

    def forget(self, index: int) -> None:
        with self._lock:
            self._rids.pop(index, None)
            if index in self._ended:
                self._ended.remove(index)

    def clear(self) -> None:
        with self._lock:
            self._rids.clear()
            self._ended.clear()


class Place:
    """One offload's place in line: its verdict once it ended (None before)."""

    __slots__ = ("ok",)

    def __init__(self) -> None:
        self.ok: bool | None = None


class InOrder:
    """Verdicts handed out in submission order, whatever order their jobs end in: SGLang pairs
    the i-th ``pop_completed_offload`` with its i-th offload. Thread-safe."""

    def __init__(self) -> None:
        self._line: collections.deque[Place] = collections.deque()
        self._lock = threading.Lock()

    def open(self) -> Place:
        """Take the next place in line; ``end`` it once with its verdict."""
        place = Place()
        with self._lock:
            self._line.append(place)
        return place

    def end(self, place: Place, ok: bool) -> None:
        with self._lock:
            place.ok = ok

    def withdraw(self, place: Place) -> None:
        """Leave the line (its job never started: SGLang was told it was not queued)."""
        with self._lock:
            self._line = collections.deque(p for p in self._line if p is not place)

    def num_completed(self) -> int:
        """Verdicts ready from the oldest on (a later one that ended first waits)."""
        with self._lock:
            count = 0
            for place in self._line:
                if place.ok is None:
                    break
                count += 1
            return count

    def pop(self) -> bool:
        """The oldest verdict.

        Raises:
            IndexError: the oldest has not ended (or none is in line).
        """
        with self._lock:
            if not self._line or self._line[0].ok is None:
                raise IndexError("no completed offload to pop")
            return bool(self._line.popleft().ok)

    def clear(self) -> None:
        with self._lock:
            self._line.clear()


class LayerLanding:
    """Where a verified load batch goes (a ``pages.engine.Landing``): SGLang's device pools,
    layer by layer from the staging rows (no join, no copy before the scatter). Layer ``l`` is
    reported to ``counter`` (SGLang's ``LayerWiseLoadCounter``) as soon as it is in place, so
    the forward starts on layer 0 while later layers arrive.

    Never lands early: every page is verified before the first layer lands, so a bad page fails
    the batch with nothing written (``fail``: every layer of the batch fails).

    Args:
        index: the batch's counter index.
        moves: the batch's pages per request and pool, in the job's part order.
        frames: their staging frames, same order.
        counter: ``complete(index, layer)`` / ``fail(index, error)``.
        num_layers: transfer layers of the batch, each completed exactly once.
        sync: waits until this thread's device writes are visible to the forward.
    """

    def __init__(self, index: int, moves: Sequence[PageMove], frames: Sequence[Any],
                 counter: Any, num_layers: int, sync: Callable[[], None]) -> None:
        self.index = index
        self.moves = list(moves)
        self._pages = [f.payloads() for f in frames]
        self._slots = [m.view.plan(m.slots) for m in self.moves]  # NOTE: once, not per layer
        self._counter = counter
        self._num_layers = num_layers
        self._sync = sync
        self.land_s = 0.0  # how long the landing took (the rest of the job read and verified)

    def early(self) -> bool:
        return False

    def land(self, cancelled: Callable[[], bool]) -> bool:
        start = time.perf_counter()
        try:
            for layer in range(self._num_layers):
                if layer and cancelled():
                    return False
                for move, slots, data in zip(self.moves, self._slots, self._pages):
                    move.view.write_layer(layer, slots, data)
                self._sync()
                self._counter.complete(self.index, layer)
            return True
        finally:
            self.land_s = time.perf_counter() - start

    def fail(self, done: Completion) -> None:
        """Fail every layer not yet landed; the verdict (``finish``) reports it."""
        self._counter.fail(self.index, PageLoadError(describe(self.moves, done)))


class ChunkLanding:
    """Where a verified load batch goes on CPU pools (a ``Stream``): each page read straight
    into its slots' rows (``targets``: one copy, from a store that ``scatters``) and verified
    there; or, from other stores, each chunk landed from staging (``land``), every layer at
    once, as soon as it is verified, on the thread that checked it (while the next chunk is
    read, given a second core). Every layer is reported to ``counter`` once the whole batch
    landed (``finish``), or all of them fail.

    Read through staging, a load copied every byte twice (page cache -> staging -> pool),
    and the two copies, side by side on two cores, slowed each other about 2x (16 MiB: read
    2.1-2.6 ms alone, 3.7-4.7 beside a landing; measured in a plain process).

    Layer by layer, the copies ran beside the forward computing the layers already landed
    and took twice as long (16-20 ms against 7-11 ms for 47 MB of SmolLM2, measured inside
    SGLang on CPU), with no TTFT gained: the forward waits on layer 0 anyway. A bad page fails
    the batch: what was written went into slots only this batch holds, which SGLang frees
    when it aborts the batch's requests (a chunk through staging with a bad page lands
    nothing).

    Args:
        index: the batch's counter index.
        moves: the batch's pages per request and pool, in the stream's pool order.
        counter: ``complete(index, layer)`` / ``fail(index, error)``.
        num_layers: transfer layers of the batch, each completed exactly once.
    """

    def __init__(self, index: int, moves: Sequence[PageMove], counter: Any,
                 num_layers: int) -> None:
        self.index = index
        self.moves = list(moves)
        self._counter = counter
        self._num_layers = num_layers
        self.seconds: list[float] = []  # NOTE: appended from several verify threads

    @property
    def land_s(self) -> float:
        """The copies' time, summed over chunks (they overlap the reads)."""
        return sum(self.seconds)

    def targets(self, span: pageio.Span) -> list[tuple[memoryview, ...]] | None:
        """Per page of ``span`` its payload's views in the pools (``PoolView.payload_views``),
        or None (it lands from staging)."""
        pool, first, count = span
        move = self.moves[pool]
        rows = move.view.rows_per_page
        return move.view.payload_views(move.slots.reshape(-1)[first * rows : (first + count) *
                                                              rows])

    def land(self, spans: Sequence[pageio.Span], piece: Sequence[pageio.PageFrames],
             read: pageio.ReadResult) -> None:
        if not read.ok:
            return  # NOTE: the batch fails on its verdict; nothing of this chunk lands
        start = time.perf_counter()
        for (pool, first, count), part in zip(spans, piece, strict=True):
            move = self.moves[pool]
            rows = move.view.rows_per_page
            slots = move.slots.reshape(-1)[first * rows : (first + count) * rows]
            move.view.write(move.view.plan(slots), part.frames.payloads())
        self.seconds.append(time.perf_counter() - start)

    def finish(self, done: Completion) -> None:
        """Report the batch to the counter: every layer landed, or every layer failed."""
        if done.ok:
            for layer in range(self._num_layers):
                self._counter.complete(self.index, layer)
        else:
            self._counter.fail(self.index, PageLoadError(describe(self.moves, done)))


def load_job(arena: StagingArena, index: int, moves: Sequence[PageMove], counter: Any,
             num_layers: int, sync: Callable[[], None], ready: Sequence[Any],
             done: Callable[[Completion], None]) -> tuple[Job, LayerLanding | ChunkLanding]:
    """The engine job of load batch ``index`` and its landing. On CPU pools a ``Stream``
    landed chunk by chunk (``ChunkLanding``); on a device every pool's pages staged as one
    read, landed layer by layer by a ``LayerLanding`` once all of them verified (the copies
    to the device overlap the forward there); ``ready`` gates its first write."""
    if all(m.view.device.type == "cpu" for m in moves):
        chunks = ChunkLanding(index, moves, counter, num_layers)

        def ended(completion: Completion) -> None:
            try:
                chunks.finish(completion)
            finally:  # NOTE: the batch must end for SGLang even if the counter raised
                done(completion)

        stream = Stream([(m.codec, m.keys) for m in moves], chunks.land, chunks.targets)
        return Job(kind=TransferKind.LOAD, parts=(), stream=stream, done=ended), chunks
    staging, parts = pageio.stage_pages(arena, [(m.codec, m.keys) for m in moves])
    landing = LayerLanding(index, moves, [p.frames for p in parts], counter, num_layers, sync)
    job = Job(kind=TransferKind.LOAD, parts=parts, staging=staging, ready=list(ready),
              land=landing, done=done)
    return job, landing


def offload_job(arena: StagingArena, moves: Sequence[PageMove], ready: Sequence[Any], *,
                skip_present: bool) -> Job:
    """The engine job of one offload (all its pools as one put): the pages are gathered from
    the device pools on the I/O thread, after ``ready``, unless ``skip_present`` and the store
    holds them all (then nothing is gathered or sent). An empty ``moves`` (nothing for this
    rank to write) completes as a success."""
    staging, parts = pageio.stage_pages(arena, [(m.codec, m.keys) for m in moves])

    def fill() -> None:
        for move, part in zip(moves, parts):
            move.view.read_pages(move.slots, out=part.frames.payloads())

    return Job(kind=TransferKind.OFFLOAD, parts=parts, staging=staging, ready=list(ready),
               fill=fill if moves else None, skip_present=skip_present)


def describe(moves: Sequence[PageMove], done: Completion) -> str:
    """Why a load did not land, in words: its bad pages per pool, else the engine's detail."""
    if done.read is None or done.read.ok:
        return done.detail or done.status.value
    out, pos = [], 0
    for move in moves:
        reasons = done.read.reasons[pos : pos + len(move.keys)]
        pos += len(move.keys)
        bad = sum(why is not None for why in reasons)
        if bad:
            out.append(f"{bad} of {len(reasons)} {move.view.name.value} page(s) missing or "
                       "corrupt")
    return "; ".join(out)


def log_load(index: int, moves: Sequence[PageMove], done: Completion,
             landing: LayerLanding | ChunkLanding) -> None:
    """One line per ended load batch: what landed and how long the read, the verify and the
    copies into the pools took (``bench sglang`` reads it), or why it failed."""
    if done.status is not TransferStatus.OK:
        logger.warning("radixlink load batch %d failed: %s", index, describe(moves, done))
        return
    pages = sum(len(m.keys) for m in moves)
    if isinstance(landing, ChunkLanding):
        logger.info("radixlink load batch %d: %d pages, %d bytes; read, verified and landed in "
                    "%.4f s (%.4f s on its thread's CPU, %.4f s of copies into the pools "
                    "during it)", index, pages, done.num_bytes, done.seconds, done.cpu_seconds,
                    landing.land_s)
    else:
        logger.info("radixlink load batch %d: %d pages, %d bytes; read and verified in %.4f s, "
                    "landed in %.4f s", index, pages, done.num_bytes,
                    done.seconds - landing.land_s, landing.land_s)
