"""Raw baselines of `radixlink bench store`: the same bytes moved by the backend's own client
with no radixlink in between, into and out of the same buffers the store gets.

memory -> ``bytes`` copies into a dict / memcpy into the buffers; file -> one plain
``open`` + write / read into the buffer per page; redis / redis+cluster -> redis-py pipelined
``SET`` / ``GET`` (+ the copy into the buffer a pool load needs); mooncake -> the same
Mooncake client's ``batch_put_from`` / ``batch_get_into`` straight from and into the
buffers, registered once (zero copy); other stores -> memcpy.
Alternative baselines (``Raw.alt``) that give a client the store's guarantees or use the
other natural command: file put -> write a temp file + rename it over the page (what a put
atomic for readers takes), file get -> an ``O_NOFOLLOW | O_NONBLOCK`` open + ``fstat`` +
readv (what reading an untrusted page file takes); redis get -> one ``MGET`` per batch.
Owns no store logic.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixlink.stores import Store
from radixlink.stores.directory import DirectoryStore
from radixlink.stores.memory import MemoryStore
from radixlink.stores.mooncake import MooncakeStore, buffer_address

Op = Callable[[], object]
Keys = Callable[[], list[str]]


@dataclass(frozen=True, slots=True)
class Raw:
    """A backend's raw put, get (into the buffers), cleanup and the baseline's name; ``alt``
    maps ``"put"`` / ``"get"`` to another raw baseline of that operation and its name."""

    put: Op
    get: Op
    cleanup: Op
    name: str
    alt: dict[str, tuple[Op, str]] = field(default_factory=dict)


def _memcpy(pages: Sequence[memoryview], buffers: Sequence[memoryview], next_keys: Keys,
            last_keys: Keys) -> Raw:
    held: dict[str, bytes] = {}

    def put() -> None:
        for key, page in zip(next_keys(), pages, strict=True):
            held[key] = bytes(page)

    def get() -> None:
        for key, buf in zip(last_keys(), buffers, strict=True):
            value = held[key]
            buf[: len(value)] = value  # memcpy into a preallocated buffer, as into staging

    return Raw(put, get, held.clear, "bytes copy / memcpy")


def _files(root: str, pages: Sequence[memoryview], buffers: Sequence[memoryview],
           next_keys: Keys, last_keys: Keys) -> Raw:
    os.makedirs(root, exist_ok=True)

    def path(key: str) -> str:
        return os.path.join(root, key.replace("/", "_"))

    def put() -> None:
        for key, page in zip(next_keys(), pages, strict=True):
            fd = os.open(path(key), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, page)
            finally:
                os.close(fd)

    def put_atomic() -> None:
        # NOTE: what a put that readers never see half-written takes: a temp file, renamed
        # over the page (the store adds its hardened flags, shard directories and index)
        for key, page in zip(next_keys(), pages, strict=True):
            final = path(key)
            tmp = final + ".tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, page)
            finally:
                os.close(fd)
            os.replace(tmp, final)

    def get() -> None:
        for key, buf in zip(last_keys(), buffers, strict=True):
            fd = os.open(path(key), os.O_RDONLY)
            try:
                os.readv(fd, [buf])
            finally:
                os.close(fd)

    def get_checked() -> None:
        # NOTE: what reading a page file as untrusted input takes: no link followed, no
        # blocking open (a FIFO), fstat to refuse non-files and oversized files
        for key, buf in zip(last_keys(), buffers, strict=True):
            fd = os.open(path(key), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_size > buf.nbytes:
                    raise OSError(f"{key}: not a page")
                os.readv(fd, [buf[: st.st_size]])
            finally:
                os.close(fd)

    return Raw(put, get, lambda: shutil.rmtree(root, ignore_errors=True),
               "open + write / readv", {"put": (put_atomic, "temp + write + rename"),
                                        "get": (get_checked, "nofollow open + fstat + readv")})


def _redis(client: Any, pages: Sequence[memoryview], buffers: Sequence[memoryview],
           next_keys: Keys, last_keys: Keys, all_keys: Keys, batch: int
           ) -> Raw:
    def put() -> None:
        items = list(zip(next_keys(), pages, strict=True))
        for start in range(0, len(items), batch):
            pipe = client.pipeline(transaction=False)
            for key, page in items[start : start + batch]:
                pipe.set(key, page)
            pipe.execute()

    def get() -> None:
        keys = last_keys()
        for start in range(0, len(keys), batch):
            pipe = client.pipeline(transaction=False)
            for key in keys[start : start + batch]:
                pipe.get(key)
            for value, buf in zip(pipe.execute(), buffers[start : start + batch], strict=True):
                buf[: len(value)] = value

    def mget() -> None:
        keys = last_keys()
        for start in range(0, len(keys), batch):
            values = client.mget(keys[start : start + batch])
            for value, buf in zip(values, buffers[start : start + batch], strict=True):
                buf[: len(value)] = value

    def cleanup() -> None:
        keys = all_keys()
        for start in range(0, len(keys), 1024):
            client.delete(*keys[start : start + 1024])

    return Raw(put, get, cleanup, "redis-py pipelined SET / GET (+ copy into the buffer)",
               {"get": (mget, "redis-py MGET (+ copy into the buffer)")})


def _mooncake(client: Any, pages: Sequence[memoryview], buffers: Sequence[memoryview],
              next_keys: Keys, last_keys: Keys, all_keys: Keys, batch: int) -> Raw:
    page_ptrs = [buffer_address(page) for page in pages]
    buffer_ptrs = [buffer_address(buf) for buf in buffers]
    sizes = [page.nbytes for page in pages]
    spans = [(min(ptrs), max(p + n for p, n in zip(ptrs, sizes))) for ptrs in
             (page_ptrs, buffer_ptrs)]
    for low, high in spans:
        client.register_buffer(low, high - low)

    def put() -> None:
        keys = next_keys()
        for start in range(0, len(keys), batch):
            end = start + batch
            client.batch_put_from(keys[start:end], page_ptrs[start:end], sizes[start:end])

    def get() -> None:
        keys = last_keys()
        for start in range(0, len(keys), batch):
            end = start + batch
            client.batch_get_into(keys[start:end], buffer_ptrs[start:end], sizes[start:end])

    def cleanup() -> None:
        keys = all_keys()
        for start in range(0, len(keys), 1024):
            client.batch_remove(keys[start : start + 1024], True)
        for low, _ in spans:
            client.unregister_buffer(low)

    return Raw(put, get, cleanup, "Mooncake client batch_put_from / batch_get_into, zero copy")


def raw_ops(store: Store, pages: Sequence[memoryview], buffers: Sequence[memoryview],
            next_keys: Keys, last_keys: Keys, all_keys: Keys, batch: int
            ) -> Raw:
    """Raw put, raw get (into ``buffers``), cleanup, the baseline's name and alternatives for
    the backend."""
    if isinstance(store, MemoryStore):
        return _memcpy(pages, buffers, next_keys, last_keys)
    if isinstance(store, DirectoryStore):
        return _files(store.root.rstrip("/") + ".rawbench", pages, buffers, next_keys,
                      last_keys)
    if isinstance(store, MooncakeStore):
        return _mooncake(store.client, pages, buffers, next_keys, last_keys, all_keys, batch)
    client = getattr(store, "client", None)
    if client is not None and hasattr(client, "pipeline"):
        return _redis(client, pages, buffers, next_keys, last_keys, all_keys, batch)
    raw = _memcpy(pages, buffers, next_keys, last_keys)
    return Raw(raw.put, raw.get, raw.cleanup,
               f"memcpy (no native raw baseline for {type(store).__name__})")
