"""Background store I/O for the linker: load jobs (get, verify, write into reserved slots) and
offload jobs (encode, put). Completions are records drained by the linker on the caller's thread.

Owns threads and the completion queue. Must not touch the tree: it only writes pool slots that a
load reserved for it, and it never raises across threads (failures are a status).
"""

from __future__ import annotations

import enum
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from radixlink.stores.base import Store
from radixlink.stores.codec import PageCodec


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
class PoolPages:
    """One pool's part of a transfer: its store keys, codec, and how to move the bytes.

    ``write`` (loads) receives a uint8 ``[num_pages, page_bytes]`` host tensor to place into
    the reserved slots; ``payloads`` (offloads) are the copied-out page bytes, one per key.
    """

    keys: list[str]
    codec: PageCodec
    write: Callable[[torch.Tensor], None] | None = None
    payloads: Sequence[Any] = ()


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


class TransferWorker:
    """A small thread pool running store transfers; completions go to a queue.

    Args:
        store: the store every job talks to.
        num_threads: concurrent transfers.
    """

    def __init__(self, store: Store, num_threads: int = 2):
        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="radixlink")
        self._done: queue.Queue[Completion] = queue.Queue()
        self._cancelled: set[int] = set()
        self._lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._next_id = 0
        self._closed = False

    def submit(self, kind: TransferKind, pools: Sequence[PoolPages]) -> int:
        """Queue a job; returns its id (ids increase in submission order).

        LOAD: one batched get of every pool's keys, verify, then write into the reserved slots.
        OFFLOAD: encode every payload, one batched put.
        """
        run = self._run_load if kind is TransferKind.LOAD else self._run_offload
        return self._submit(kind, run, pools)

    def cancel(self, job_id: int) -> None:
        """Ask a queued load not to write; it completes as CANCELLED (its slots stay reserved
        until that completion is drained, so no write can land in freed memory)."""
        with self._lock:
            self._cancelled.add(job_id)

    def drain(self, block_for: float | None = None) -> list[Completion]:
        """Every completion available now; with ``block_for``, wait that long for the first."""
        out: list[Completion] = []
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

    def close(self) -> None:
        """Stop accepting jobs and join the threads (queued jobs still run to completion)."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True)

    def _submit(self, kind: TransferKind, fn: Callable[[int, Sequence[PoolPages]], Completion],
                pools: Sequence[PoolPages]) -> int:
        with self._lock:
            if self._closed:
                raise ValueError("the linker's transfer worker is closed; create a new linker")
            job_id = self._next_id
            self._next_id += 1
            self._pending += 1
        self._pool.submit(self._guarded, job_id, kind, fn, pools)
        return job_id

    def _guarded(self, job_id: int, kind: TransferKind,
                 fn: Callable[[int, Sequence[PoolPages]], Completion],
                 pools: Sequence[PoolPages]) -> None:
        start = time.perf_counter()
        try:
            done = fn(job_id, pools)
        except Exception as exc:  # noqa: BLE001 - a failure is a status, never a raise across threads
            done = Completion(job_id=job_id, kind=kind, status=TransferStatus.STORE_ERROR,
                              detail=f"{type(exc).__name__}: {exc}")
        done.seconds = time.perf_counter() - start
        self._done.put(done)
        with self._idle:
            self._pending -= 1
            self._cancelled.discard(job_id)
            self._idle.notify_all()

    def _run_load(self, job_id: int, pools: Sequence[PoolPages]) -> Completion:
        keys = [key for pool in pools for key in pool.keys]
        blobs = self.store.get(keys)
        pages: list[torch.Tensor] = []
        pos, num_bytes = 0, 0
        for pool in pools:
            raw = blobs[pos : pos + len(pool.keys)]
            pos += len(pool.keys)
            views = [pool.codec.decode(blob, key) for blob, key in zip(raw, pool.keys)]
            if any(v is None for v in views):
                missing = any(b is None for b in raw)
                status = TransferStatus.MISSING if missing else TransferStatus.CORRUPT
                return Completion(job_id=job_id, kind=_LOAD, status=status,
                                  detail=f"{sum(v is None for v in views)} bad page(s)")
            if any(v.nbytes != pool.codec.page_bytes for v in views):  # type: ignore[union-attr]
                return Completion(job_id=job_id, kind=_LOAD, status=TransferStatus.CORRUPT,
                                  detail="short page")
            # NOTE: one join + one frombuffer per pool; the pool scatters all pages in one op.
            joined = bytearray(b"".join(views))  # type: ignore[arg-type]
            pages.append(torch.frombuffer(joined, dtype=torch.uint8).view(len(views), -1))
            num_bytes += len(joined)
        with self._lock:
            if job_id in self._cancelled:
                return Completion(job_id=job_id, kind=_LOAD, status=TransferStatus.CANCELLED)
        for pool, data in zip(pools, pages):
            assert pool.write is not None, "a load job needs a writer per pool"
            pool.write(data)
        return Completion(job_id=job_id, kind=_LOAD, status=TransferStatus.OK,
                          num_bytes=num_bytes)

    def _run_offload(self, job_id: int, pools: Sequence[PoolPages]) -> Completion:
        items: dict[str, bytes] = {}
        for pool in pools:
            for key, payload in zip(pool.keys, pool.payloads):
                items[key] = pool.codec.encode(payload, key)
        results = self.store.put(items)
        num_bytes = sum(len(v) for v in items.values())
        status = TransferStatus.OK if all(results) else TransferStatus.STORE_ERROR
        detail = "" if all(results) else f"{results.count(False)} page(s) not stored"
        return Completion(job_id=job_id, kind=_OFFLOAD, status=status, num_bytes=num_bytes,
                          detail=detail)
