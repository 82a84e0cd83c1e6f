"""The linker's two background threads: layer-wise loads and in-order offloads.

Owns the threads, their queues and the completion records. A failure is a status (a failed
layer counter, a False offload), never an exception across threads. Must not import SGLang
or touch its tree: loads write only the slots the tree reserved for them.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from radixlink.integrations.sglang.device_pools import PoolView
from radixlink.pages import pageio
from radixlink.pages.staging import StagingArena
from radixlink.stores.base import Store

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
        self._lock = threading.Lock()  # NOTE: ``ended`` runs on the loader thread

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


class _Worker:
    """A daemon thread draining a FIFO queue; ``join`` waits for every queued job."""

    def __init__(self, name: str, run: Callable[[Any], None]) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self._run = run
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def put(self, job: Any) -> None:
        self._queue.put(job)

    def join(self) -> None:
        self._queue.join()

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                self._run(job)
            finally:
                self._queue.task_done()


class LayerLoader:
    """Runs load batches: one batched ``get_into`` staging, verify every page, then write layer
    by layer from the staging (no join, no copy before the scatter).

    Every page is verified before the first layer lands, so a bad page fails the batch with
    nothing written. Under the one corrupt-page policy (``pages.pageio``) every bad page of
    the batch is counted and the present ones are deleted from the store and recorded in
    ``bad`` (lookups read them absent until they are written again). Layer ``l`` is reported
    to ``counter`` (SGLang's ``LayerWiseLoadCounter``) as soon as it is in place, so the
    forward starts on layer 0 while later layers arrive.

    Args:
        store: the page store.
        counter: ``complete(index, layer)`` / ``fail(index, error)``.
        num_layers: transfer layers of the batch, each completed exactly once.
        sync: waits until this thread's device writes are visible to the forward.
        bad: the keys found bad here.
        arena: the staging buffers loads read into.
        on_done: called with the batch's index once it has landed or failed.
    """

    def __init__(
        self,
        store: Store,
        counter: Any,
        num_layers: int,
        sync: Callable[[], None],
        bad: pageio.BadKeys,
        arena: StagingArena,
        on_done: Callable[[int], None] = lambda index: None,
    ):
        self._store = store
        self._on_done = on_done
        self._bad = bad
        self._arena = arena
        self._counter = counter
        self._num_layers = num_layers
        self._sync = sync
        self._worker = _Worker("radixlink-sglang-load", self._run)

    def submit(self, index: int, moves: Sequence[PageMove], ready: Any = None) -> None:
        """Queue batch ``index``; ``ready`` (a device event or None) gates its first write."""
        self._worker.put((index, list(moves), ready))

    def join(self) -> None:
        self._worker.join()

    def stop(self) -> None:
        self._worker.stop()

    def _run(self, job: tuple[int, list[PageMove], Any]) -> None:
        index, moves, ready = job
        staging = None
        try:
            start = time.perf_counter()
            staging, parts = pageio.stage_pages(self._arena, [(m.codec, m.keys) for m in moves])
            read = pageio.read(self._store, parts, bad=self._bad)
            if not read.ok:
                raise PageLoadError(_describe(moves, read))
            pages = [part.frames.payloads() for part in parts]
            read_s = time.perf_counter() - start
            if ready is not None:
                ready.synchronize()
            for layer in range(self._num_layers):
                for move, data in zip(moves, pages):
                    move.view.write_layer(layer, move.slots, data)
                self._sync()
                self._counter.complete(index, layer)
            logger.info(
                "radixlink load batch %d: %d pages, %d bytes; read and verified in %.4f s, "
                "landed in %.4f s", index, sum(len(m.keys) for m in moves),
                sum(int(p.numel()) for p in pages), read_s, time.perf_counter() - start - read_s,
            )
        except Exception as exc:  # noqa: BLE001 - reported through the counter, never raised
            logger.warning("radixlink load batch %d failed: %s", index, exc)
            self._counter.fail(index, exc)
        finally:
            if staging is not None:
                self._arena.release(*staging)
            self._on_done(index)


def _describe(moves: Sequence[PageMove], read: pageio.ReadResult) -> str:
    """The bad pages of a read, per pool, in words."""
    out, pos = [], 0
    for move in moves:
        reasons = read.reasons[pos : pos + len(move.keys)]
        pos += len(move.keys)
        bad = sum(why is not None for why in reasons)
        if bad:
            out.append(f"{bad} of {len(reasons)} {move.view.name.value} page(s) missing or "
                       "corrupt")
    return "; ".join(out)


class Offloader:
    """Runs offloads in submission order and keeps one success flag per offload, oldest first.

    Args:
        store: the page store.
        bad: the keys found bad here (a stored page is no longer bad).
        arena: the staging buffers offloads are encoded in.
    """

    def __init__(self, store: Store, bad: pageio.BadKeys, arena: StagingArena) -> None:
        self._store = store
        self._bad = bad
        self._arena = arena
        self._done: collections.deque[bool] = collections.deque()
        self._worker = _Worker("radixlink-sglang-offload", self._run)

    def submit(self, moves: Sequence[PageMove], ready: Sequence[Any] = ()) -> None:
        """Queue one offload (all its pools as one put); ``ready`` events gate its reads. An
        empty ``moves`` (nothing for this rank to write) completes as a success, in order."""
        self._worker.put((list(moves), list(ready)))

    def num_completed(self) -> int:
        return len(self._done)

    def pop(self) -> bool:
        """The oldest completed offload's result.

        Raises:
            IndexError: none has completed.
        """
        return self._done.popleft()

    def join(self) -> None:
        self._worker.join()

    def clear(self) -> None:
        self._done.clear()

    def stop(self) -> None:
        self._worker.stop()

    def _run(self, job: tuple[list[PageMove], list[Any]]) -> None:
        moves, ready = job
        staging = None
        try:
            for event in ready:
                event.synchronize()
            staging, parts = pageio.stage_pages(self._arena, [(m.codec, m.keys) for m in moves])
            for move, part in zip(moves, parts):
                part.frames.payloads().copy_(move.view.read_pages(move.slots))
            ok = pageio.write(self._store, parts, bad=self._bad).ok
        except Exception as exc:  # noqa: BLE001 - a failed offload is a False, never a raise
            logger.warning("radixlink offload failed: %s", exc)
            ok = False
        finally:
            if staging is not None:
                self._arena.release(*staging)
        self._done.append(ok)
