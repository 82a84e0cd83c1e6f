"""``tiered://?front=<url>&back=<url>``: a bounded fast store in front of a slower one.

Owns the write-behind queue and read promotion. The two stores are any ``Store``s; usually a
memory front over a directory or Redis back.
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from radixlink.errors import StoreError
from radixlink.stores.base import Store
from radixlink.stores.params import AUTH, Param, integer, read_params, text
from radixlink.stores.registry import open_store, split_url

DEFAULT_QUEUE_BATCHES = 64
PARAMS = {
    "front": Param(text, None, "a percent-encoded store URL"),
    "back": Param(text, None, "a percent-encoded store URL"),
    "queue": Param(integer(1, 1 << 20), DEFAULT_QUEUE_BATCHES, "an int from 1 to 1048576"),
    "auth": AUTH,
}
_STOP = None


class TieredStore(Store):
    """Writes go to the front synchronously and to the back on a background thread; reads
    are served from the front, then the back, and back hits are promoted into the front.

    The back queue holds at most ``max_queued_batches`` put batches; past that, ``put`` waits
    (backpressure, never unbounded memory). ``flush()`` waits until the queue is drained and
    ``close()`` drains it, then closes both stores.

    The back is the tier other processes share, so presence is the back's: ``exists`` says
    True for a key the back holds, or one the front holds whose back write is still queued.
    A page the back lost or never took (a failed back write, back eviction) is absent even
    while the front still holds it, so a linker revalidating its marks writes it again
    (DESIGN.md section 6b: a page missing from the back is re-written there, never assumed
    stored).

    A failing back store degrades to a front-only store: back errors are counted
    (``back_errors``, ``back_put_failures``); ``get`` reads them as misses and ``exists``
    answers from the front while the back cannot answer. They are not raised.

    Args:
        front: the fast, bounded store (owned: closed by ``close``).
        back: the slower store (owned: closed by ``close``).
        max_queued_batches: bound of the write-behind queue, in put batches.
    """

    def __init__(self, front: Store, back: Store, max_queued_batches: int = DEFAULT_QUEUE_BATCHES):
        if max_queued_batches <= 0:
            raise ValueError(f"max_queued_batches must be > 0, got {max_queued_batches}")
        self.front = front
        self.back = back
        self._queue: queue.Queue[dict[str, bytes] | None] = queue.Queue(max_queued_batches)
        self._lock = threading.Lock()
        self._counts = {"back_hits": 0, "back_errors": 0, "back_puts": 0, "back_put_failures": 0}
        self._queued: Counter[str] = Counter()  # key -> back writes queued, not yet done
        self._closed = False
        self._writer = threading.Thread(target=self._drain, name="radixlink-tiered", daemon=True)
        self._writer.start()

    @classmethod
    def from_url(cls, url: str, *, read_only: bool = False) -> TieredStore:
        """``tiered://?front=<url-encoded url>&back=<url-encoded url>&queue=64&auth=env:NAME``.

        The page secret is ``auth`` when given, else the back's or the front's (they must not
        name different secrets)."""
        scheme, _, params = split_url(url)
        options = read_params(scheme, params, PARAMS)
        if options["front"] is None or options["back"] is None:
            raise ValueError(
                "tiered:// store URL needs front= and back=, e.g. tiered://?front=memory%3A%2F%2F"
                "%3Fcapacity%3D1GiB&back=file%3A%2F%2F%2Ftmp%2Fstore"
            )
        front = open_store(options["front"], read_only=read_only)
        try:
            back = open_store(options["back"], read_only=read_only)
        except BaseException:
            front.close()
            raise
        store = cls(front, back, options["queue"])
        store._page_secret = options["auth"]
        if store._page_secret is None and None not in (front.page_secret, back.page_secret) \
                and front.page_secret != back.page_secret:
            store.close()
            raise ValueError("tiered:// store URL: front and back name different page secrets "
                             "(auth=); give one auth= on the tiered URL instead")
        return store

    @property
    def page_secret(self) -> bytes | None:
        """The URL's ``auth=`` when given, else the back store's, else the front's."""
        return self._page_secret or self.back.page_secret or self.front.page_secret

    @property
    def shared(self) -> bool:  # type: ignore[override]
        """Whether other processes reach either tier."""
        return self.front.shared or self.back.shared

    def exists(self, keys: Sequence[str]) -> list[bool]:
        found = self.front.exists(keys)
        with self._lock:
            ask = [i for i, hit in enumerate(found) if not (hit and self._queued[keys[i]])]
        if ask:
            back_found = self._back_call(self.back.exists, [keys[i] for i in ask])
            if back_found is not None:  # NOTE: else the back cannot answer: the front does
                for i, hit in zip(ask, back_found, strict=True):
                    found[i] = hit
        return found

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        values = self.front.get(keys)
        missing = [i for i, value in enumerate(values) if value is None]
        if not missing:
            return values
        back_values = self._back_call(self.back.get, [keys[i] for i in missing])
        promote: dict[str, bytes] = {}
        for i, value in zip(missing, back_values or [None] * len(missing), strict=True):
            if value is not None:
                values[i] = promote[keys[i]] = value
        if promote:
            self.front.put(promote)
            self._count(back_hits=len(promote))
        return values

    def put(self, items: Mapping[str, bytes]) -> list[bool]:
        if self._closed:
            raise StoreError("put on a closed tiered store")
        batch = {key: bytes(value) for key, value in items.items()}
        out = self.front.put(batch)
        with self._lock:
            self._queued.update(list(batch))
        self._queue.put(batch)
        return out

    def delete(self, keys: Sequence[str]) -> int:
        self.flush()  # NOTE: so a queued write cannot resurrect a deleted key
        removed_front = self.front.delete(keys)
        removed_back = self._back_call(self.back.delete, keys)
        return max(removed_front, removed_back or 0)

    def flush(self) -> None:
        self._queue.join()
        self.back.flush()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            counts = dict(self._counts)
        back = self._back_call(self.back.stats) or {}
        return {"front": self.front.stats(), "back": back, "queued": self._queue.qsize(), **counts}

    def scan(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        self.flush()
        return self.back.scan(prefix)

    def gc(self) -> int:
        return self.front.gc() + self.back.gc()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._writer.join()
        self.front.close()
        self.back.close()

    def _drain(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                if batch is _STOP:
                    return
                try:
                    results = self._back_call(self.back.put, batch) or [False] * len(batch)
                except Exception:  # noqa: BLE001 - a dead writer thread would hang flush()
                    results = [False] * len(batch)
                self._count(back_puts=len(results), back_put_failures=results.count(False))
            finally:
                if batch is not _STOP:
                    with self._lock:
                        self._queued.subtract(list(batch))
                        for key in batch:
                            if self._queued[key] <= 0:
                                del self._queued[key]
                self._queue.task_done()

    def _back_call(self, method: Any, *args: Any) -> Any:
        """Call a back-store method; a StoreError is counted and turns into None."""
        try:
            return method(*args)
        except StoreError:
            self._count(back_errors=1)
            return None

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] += delta
