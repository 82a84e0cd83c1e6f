"""``memory://?capacity=2GiB``: an in-process store, LRU bounded by bytes.

Owns a dict of immutable bytes values. Nothing survives ``close()`` or the process.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from radixlink.stores.base import Store
from radixlink.stores.params import AUTH, Param, read_params, size
from radixlink.stores.registry import parse_size, split_url

DEFAULT_CAPACITY = "2GiB"
PARAMS = {
    "capacity": Param(
        size(1), parse_size(DEFAULT_CAPACITY), "a size from 1 byte to 8 EiB, such as 2GiB"
    ),
    "auth": AUTH,
}


class MemoryStore(Store):
    """Thread-safe LRU of ``bytes`` values, evicting least recently used pages past
    ``capacity_bytes``. ``bytes`` values are stored by reference (they are immutable) and
    ``get`` returns them as stored, so neither copies; other buffers are copied once on put,
    and ``get_into`` copies once into the caller's buffer.

    Args:
        capacity_bytes: the most value bytes held; a single value larger than this is refused
            (``put`` returns False for it and counts it).
    """

    in_process = True  # a put is a copy and a dict insert: nothing for a thread to overlap
    shared = False  # NOTE: this process's memory: no other process reads its pages
    scatters = True  # NOTE: a value is copied once into its pieces, as into a frame

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
        pages = self._pages
        with self._lock:
            out = list(map(pages.get, keys))
            misses = out.count(None)
            # NOTE: the LRU refresh in one C loop (deque of maxlen 0 just drains the map)
            if not misses:
                deque(map(pages.move_to_end, keys), maxlen=0)
            else:
                deque(map(pages.move_to_end, [k for k, v in zip(keys, out) if v is not None]),
                      maxlen=0)
            self._counts["hits"] += len(out) - misses
            self._counts["misses"] += misses
        return out

    def get_into(self, keys: Sequence[str], buffers: Sequence[memoryview]) -> list[int | None]:
        """Copy each value into its buffer (the one copy a load needs); see ``Store``."""
        if len(keys) != len(buffers):
            raise ValueError(f"get_into: {len(keys)} keys but {len(buffers)} buffers; pass one "
                             "buffer per key")
        # NOTE: the references are taken under the lock, the copies run outside it (values
        # are immutable bytes, so a concurrent overwrite or eviction cannot tear them).
        out: list[int | None] = []
        for buf, value in zip(buffers, self.get(keys)):
            if value is None:
                out.append(None)
                continue
            size = len(value)
            if size <= buf.nbytes:
                buf[:size] = value
            else:
                buf[:] = value[: buf.nbytes]
            out.append(size)
        return out

    def put(self, items: Mapping[str, Any]) -> list[bool]:
        # NOTE: bytes(...) returns a bytes value itself and copies other buffers (a staging
        # view the caller reuses), outside the lock: the one copy a memory store needs.
        keys = list(items)
        values = list(map(bytes, items.values()))
        sizes = list(map(len, values))
        if not sizes:
            return []
        pages = self._pages
        with self._lock:
            if max(sizes) <= self.capacity_bytes:
                # NOTE: the common batch in C loops: drop old copies, then one update (new
                # keys go to the LRU end; replaced ones were popped first so they do too).
                if not pages.keys().isdisjoint(keys):
                    for key in pages.keys() & set(keys):
                        self._bytes -= len(pages.pop(key))
                pages.update(zip(keys, values))
                self._bytes += sum(sizes)
                out = [True] * len(keys)
            else:
                out = [self._put_one_locked(key, value) for key, value in zip(keys, values)]
            self._counts["puts"] += len(out)
            self._counts["put_failures"] += out.count(False)
            self._evict_locked()
        return out

    def _put_one_locked(self, key: str, value: bytes) -> bool:
        if len(value) > self.capacity_bytes:
            return False
        old = self._pages.pop(key, None)
        self._bytes += len(value) - (len(old) if old is not None else 0)
        self._pages[key] = value
        return True

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
