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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from radixlink.integrations.sglang.device_pools import PoolView
from radixlink.stores.base import Store
from radixlink.stores.codec import PageCodec

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class PageMove:
    """One pool's pages of one request: store keys and the device slots they map to."""

    view: PoolView
    codec: PageCodec
    keys: list[str]
    slots: torch.Tensor


class PageLoadError(RuntimeError):
    """A load batch could not be restored (missing, corrupt or unreadable pages)."""


class Quarantine:
    """Store keys whose pages failed verification here; lookups treat them as absent.

    A load that found a corrupt page fails its batch (SGLang aborts those requests); with the
    page quarantined, the next lookup of the same prefix stops before it and restores the
    longest legal shorter prefix. Local to this process (a reader never deletes store data);
    bounded, oldest first out; a key this process offloads again is released.
    """

    def __init__(self, capacity: int = 65536) -> None:
        self._keys: dict[str, None] = {}
        self._capacity = capacity
        self._lock = threading.Lock()

    def add(self, keys: Sequence[str]) -> None:
        with self._lock:
            for key in keys:
                self._keys[key] = None
            while len(self._keys) > self._capacity:
                del self._keys[next(iter(self._keys))]

    def discard(self, keys: Sequence[str]) -> None:
        if self._keys:
            with self._lock:
                for key in keys:
                    self._keys.pop(key, None)

    def mask(self, keys: Sequence[str], flags: Sequence[bool]) -> list[bool]:
        """``flags`` with every quarantined key's flag cleared."""
        if not self._keys:
            return list(flags)
        with self._lock:
            return [ok and key not in self._keys for key, ok in zip(keys, flags)]


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
    """Runs load batches: one batched ``get``, verify every page, then write layer by layer.

    Every page is verified before the first layer lands, so a bad page fails the batch with
    nothing written. Layer ``l`` is reported to ``counter`` (SGLang's ``LayerWiseLoadCounter``)
    as soon as it is in place, so the forward starts on layer 0 while later layers arrive.

    Args:
        store: the page store.
        counter: ``complete(index, layer)`` / ``fail(index, error)``.
        num_layers: transfer layers of the batch, each completed exactly once.
        sync: waits until this thread's device writes are visible to the forward.
        on_bad_pages: called with the keys of pages that were present but failed
            verification (checksum, layout, key digest, seal).
        on_done: called with the batch's index once it has landed or failed.
    """

    def __init__(
        self,
        store: Store,
        counter: Any,
        num_layers: int,
        sync: Callable[[], None],
        on_bad_pages: Callable[[list[str]], None],
        on_done: Callable[[int], None] = lambda index: None,
    ):
        self._store = store
        self._on_done = on_done
        self._on_bad_pages = on_bad_pages
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
        try:
            pages = self._fetch(moves)
            if ready is not None:
                ready.synchronize()
            for layer in range(self._num_layers):
                for move, data in zip(moves, pages):
                    move.view.write_layer(layer, move.slots, data)
                self._sync()
                self._counter.complete(index, layer)
        except Exception as exc:  # noqa: BLE001 - reported through the counter, never raised
            logger.warning("radixlink load batch %d failed: %s", index, exc)
            self._counter.fail(index, exc)
        finally:
            self._on_done(index)

    def _fetch(self, moves: Sequence[PageMove]) -> list[torch.Tensor]:
        keys = [key for move in moves for key in move.keys]
        blobs = self._store.get(keys)
        out, pos = [], 0
        for move in moves:
            views = [
                move.codec.decode(blob, key)
                for blob, key in zip(blobs[pos : pos + len(move.keys)], move.keys)
            ]
            raw = blobs[pos : pos + len(move.keys)]
            pos += len(move.keys)
            corrupt = [
                key for key, blob, v in zip(move.keys, raw, views)
                if blob is not None and (v is None or v.nbytes != move.view.page_bytes)
            ]
            if corrupt:
                self._on_bad_pages(corrupt)
            bad = sum(v is None or v.nbytes != move.view.page_bytes for v in views)
            if bad:
                raise PageLoadError(
                    f"{bad} of {len(views)} {move.view.name.value} page(s) missing or corrupt"
                )
            # NOTE: one join + one frombuffer per pool; write_layer scatters all pages at once.
            joined = bytearray(b"".join(views))  # type: ignore[arg-type]
            out.append(torch.frombuffer(joined, dtype=torch.uint8).view(len(views), -1))
        return out


class Offloader:
    """Runs offloads in submission order and keeps one success flag per offload, oldest first.

    Args:
        store: the page store.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
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
        try:
            for event in ready:
                event.synchronize()
            items: dict[str, bytes] = {}
            for move in moves:
                pages = move.view.read_pages(move.slots)
                for row, key in enumerate(move.keys):
                    items[key] = move.codec.encode(pages[row], key)
            ok = all(self._store.put(items)) if items else True
        except Exception as exc:  # noqa: BLE001 - a failed offload is a False, never a raise
            logger.warning("radixlink offload failed: %s", exc)
            ok = False
        self._done.append(ok)
