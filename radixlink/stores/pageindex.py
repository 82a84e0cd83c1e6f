"""The directory store's in-memory LRU index (key -> page bytes), its counters, the capacity cap
and the filesystem's free-space floor. Knows nothing of paths or files (directory.py,
pagefiles.py): it names the keys to delete and the store unlinks them.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Sequence
from typing import Any

COUNTERS = (
    "hits", "misses", "puts", "put_failures", "read_errors", "refused", "evicted",
    "evicted_for_space",
)  # fmt: skip


def bytes_short(root: str, min_free: tuple[str, float], batch_bytes: int) -> int:
    """How many bytes writing ``batch_bytes`` under ``root`` would take from below the
    ``min_free`` floor (``("percent", p)`` of the filesystem or ``("bytes", n)``); 0 when none,
    or when the filesystem cannot be asked."""
    try:
        fs = os.statvfs(root)
    except OSError:
        return 0  # NOTE: cannot tell; the writes will report ENOSPC themselves
    kind, amount = min_free
    floor = amount * fs.f_blocks * fs.f_frsize / 100 if kind == "percent" else amount
    return max(0, int(batch_bytes + floor - fs.f_bavail * fs.f_frsize))


class PageIndex:
    """Page sizes in least-recently-used-first order, their total and the store's counters,
    under one lock (several threads share a store). Methods that drop entries return the
    victims' keys; the caller deletes their files outside the lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._index: OrderedDict[str, int] = OrderedDict()
        self._bytes = 0
        self._counts: Counter[str] = Counter()
        self._put_errors: Counter[str] = Counter()
        self._unlink_errors: Counter[str] = Counter()

    def observe(self, keys: Sequence[str], sizes: Sequence[int | None], touch: bool) -> None:
        """Fold what a read saw on disk into the index (other processes add and evict)."""
        with self._lock:
            index = self._index
            if touch and None not in sizes and list(map(index.get, keys)) == list(sizes):
                # NOTE: the common read (every page known, at its known size) in C-level
                # loops: a Python step per page was a twentieth of a 64 KiB read on tmpfs
                deque(map(index.move_to_end, keys), maxlen=0)
                self._counts["hits"] += len(keys)
                return
            for key, size_ in zip(keys, sizes, strict=True):
                if size_ is None:
                    self._bytes -= index.pop(key, 0)
                    continue
                known = index.get(key)
                if known is None:
                    index[key] = size_  # NOTE: a new key goes last, the most recently used
                    self._bytes += size_
                elif touch:
                    if known != size_:  # another process rewrote it
                        index[key] = size_
                        self._bytes += size_ - known
                    index.move_to_end(key)
            if touch:
                hits = sum(size_ is not None for size_ in sizes)
                self._counts["hits"] += hits
                self._counts["misses"] += len(sizes) - hits

    def add_puts(self, written: Iterable[tuple[str, int]], num_puts: int,
                 capacity_bytes: int) -> list[str]:
        """Record a put batch (``written``: the pages that landed, most recent last; ``num_puts``
        pages asked for); returns the least recently used keys past ``capacity_bytes``."""
        with self._lock:
            for key, size_ in written:
                self._set(key, size_)
            self._counts["puts"] += num_puts
            return self._pop_victims_locked(capacity_bytes)

    def remove(self, keys: Sequence[str]) -> None:
        with self._lock:
            for key in keys:
                self._bytes -= self._index.pop(key, 0)

    def rebuild(self, found: Iterable[tuple[str, int]], capacity_bytes: int | None) -> list[str]:
        """Replace the index with ``found`` (keys and sizes, least recently used first);
        returns the keys past ``capacity_bytes`` (none when it is None: read-only)."""
        with self._lock:
            self._index = OrderedDict(found)
            self._bytes = sum(self._index.values())
            return [] if capacity_bytes is None else self._pop_victims_locked(capacity_bytes)

    def pop_bytes(self, num_bytes: int) -> tuple[list[str], int]:
        """Pop least recently used keys of at least ``num_bytes``; returns them and the bytes
        they held."""
        with self._lock:
            before = self._bytes
            victims = self._pop_victims_locked(max(0, before - num_bytes))
            return victims, before - self._bytes

    def count(self, counter: str, num: int = 1) -> None:
        with self._lock:
            self._counts[counter] += num

    def count_read_misses(self, refused: int, errors: int) -> None:
        """Count a read batch's refused files and read errors."""
        if refused or errors:
            with self._lock:
                self._counts["refused"] += refused
                self._counts["read_errors"] += errors

    def count_put_error(self, code: int) -> None:
        with self._lock:
            self._counts["put_failures"] += 1
            self._put_errors[errno.errorcode.get(code, "EUNKNOWN")] += 1

    def count_unlink_error(self, code: int) -> None:
        """Count a page file that could not be deleted (evicted or deleted all the same)."""
        with self._lock:
            self._unlink_errors[errno.errorcode.get(code, "EUNKNOWN")] += 1

    def stats(self) -> dict[str, Any]:
        """``pages``, ``bytes``, each of ``COUNTERS``, then ``put_errors`` and
        ``unlink_errors`` (errno name -> n)."""
        with self._lock:
            return {
                "pages": len(self._index),
                "bytes": self._bytes,
                **{name: self._counts[name] for name in COUNTERS},
                "put_errors": dict(self._put_errors),
                "unlink_errors": dict(self._unlink_errors),
            }

    def _set(self, key: str, size_: int) -> None:
        self._bytes += size_ - self._index.pop(key, 0)
        self._index[key] = size_

    def _pop_victims_locked(self, target_bytes: int) -> list[str]:
        """Pop least recently used keys until the index holds at most ``target_bytes``."""
        victims = []
        while self._bytes > target_bytes and self._index:
            key, size_ = self._index.popitem(last=False)
            self._bytes -= size_
            victims.append(key)
        self._counts["evicted"] += len(victims)
        return victims
