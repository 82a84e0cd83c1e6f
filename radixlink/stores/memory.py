"""``memory://?capacity=2GiB``: an in-process store, LRU bounded by bytes.

Owns a dict of immutable bytes values. Nothing survives ``close()`` or the process.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from radixlink.stores.base import Store
from radixlink.stores.params import AUTH, Param, read_params, size
from radixlink.stores.registry import parse_size, split_url

DEFAULT_CAPACITY = "2GiB"
PARAMS = {
    "capacity": Param(size(1), parse_size(DEFAULT_CAPACITY), "a size > 0 such as 2GiB"),
    "auth": AUTH,
}


class MemoryStore(Store):
    """Thread-safe LRU of ``bytes`` values, evicting least recently used pages past
    ``capacity_bytes``. Values are stored by reference (bytes are immutable), so put and get
    copy nothing.

    Args:
        capacity_bytes: the most value bytes held; a single value larger than this is refused
            (``put`` returns False for it and counts it).
    """

    def __init__(self, capacity_bytes: int = parse_size(DEFAULT_CAPACITY)):
        if capacity_bytes <= 0:
            raise ValueError(f"capacity must be > 0 bytes, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._pages: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._counts = {"hits": 0, "misses": 0, "puts": 0, "put_failures": 0, "evicted": 0}

    @classmethod
    def from_url(cls, url: str, *, read_only: bool = False) -> MemoryStore:
        """``memory://?capacity=2GiB&auth=env:NAME`` (``read_only`` changes nothing: a new
        memory store is empty)."""
        scheme, _, params = split_url(url)
        options = read_params(scheme, params, PARAMS)
        store = cls(options["capacity"])
        store._page_secret = options["auth"]
        return store

    def exists(self, keys: Sequence[str]) -> list[bool]:
        pages = self._pages
        with self._lock:
            return [key in pages for key in keys]

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        out: list[bytes | None] = []
        with self._lock:
            for key in keys:
                value = self._pages.get(key)
                if value is not None:
                    self._pages.move_to_end(key)
                out.append(value)
            hits = sum(value is not None for value in out)
            self._counts["hits"] += hits
            self._counts["misses"] += len(out) - hits
        return out

    def put(self, items: Mapping[str, bytes]) -> list[bool]:
        # NOTE: bytes(...) is a no-op for bytes and copies other buffers, outside the lock.
        values = [(key, bytes(value)) for key, value in items.items()]
        out = []
        with self._lock:
            for key, value in values:
                ok = len(value) <= self.capacity_bytes
                if ok:
                    old = self._pages.pop(key, None)
                    self._bytes += len(value) - (len(old) if old is not None else 0)
                    self._pages[key] = value
                out.append(ok)
            self._counts["puts"] += len(out)
            self._counts["put_failures"] += out.count(False)
            self._evict_locked()
        return out

    def delete(self, keys: Sequence[str]) -> int:
        removed = 0
        with self._lock:
            for key in keys:
                value = self._pages.pop(key, None)
                if value is not None:
                    self._bytes -= len(value)
                    removed += 1
        return removed

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "pages": len(self._pages),
                "bytes": self._bytes,
                "capacity_bytes": self.capacity_bytes,
                **self._counts,
            }

    def scan(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        with self._lock:  # a snapshot, so callers may delete while iterating
            items = [(key, len(value)) for key, value in self._pages.items()]
        return iter([(key, size) for key, size in items if key.startswith(prefix)])

    def close(self) -> None:
        with self._lock:
            self._pages.clear()
            self._bytes = 0

    def _evict_locked(self) -> None:
        while self._bytes > self.capacity_bytes:
            _, value = self._pages.popitem(last=False)
            self._bytes -= len(value)
            self._counts["evicted"] += 1
