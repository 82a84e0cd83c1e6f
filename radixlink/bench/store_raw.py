"""Raw baselines of `radixlink bench store`: the same bytes moved by the backend's own client
with no radixlink in between, into and out of the same buffers the store gets.

memory -> ``bytes`` copies into a dict / memcpy into the buffers; file -> one plain
``open`` + write / read into the buffer per page; redis / redis+cluster -> redis-py pipelined
``SET`` / ``GET`` (+ the copy into the buffer a pool load needs); other stores -> memcpy.
Owns no store logic.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from typing import Any

from radixlink.stores import Store
from radixlink.stores.directory import DirectoryStore
from radixlink.stores.memory import MemoryStore

Op = Callable[[], object]
Keys = Callable[[], list[str]]


def _memcpy(pages: Sequence[memoryview], buffers: Sequence[memoryview], next_keys: Keys,
            last_keys: Keys) -> tuple[Op, Op, Op, str]:
    held: dict[str, bytes] = {}

    def put() -> None:
        for key, page in zip(next_keys(), pages, strict=True):
            held[key] = bytes(page)

    def get() -> None:
        for key, buf in zip(last_keys(), buffers, strict=True):
            value = held[key]
            buf[: len(value)] = value  # memcpy into a preallocated buffer, as into staging

    return put, get, held.clear, "bytes copy / memcpy"


def _files(root: str, pages: Sequence[memoryview], buffers: Sequence[memoryview],
           next_keys: Keys, last_keys: Keys) -> tuple[Op, Op, Op, str]:
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

    def get() -> None:
        for key, buf in zip(last_keys(), buffers, strict=True):
            fd = os.open(path(key), os.O_RDONLY)
            try:
                os.readv(fd, [buf])
            finally:
                os.close(fd)

    return put, get, lambda: shutil.rmtree(root, ignore_errors=True), "open + write / readv"


def _redis(client: Any, pages: Sequence[memoryview], buffers: Sequence[memoryview],
           next_keys: Keys, last_keys: Keys, all_keys: Keys, batch: int
           ) -> tuple[Op, Op, Op, str]:
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

    def cleanup() -> None:
        keys = all_keys()
        for start in range(0, len(keys), 1024):
            client.delete(*keys[start : start + 1024])

    return put, get, cleanup, "redis-py pipelined SET / GET (+ copy into the buffer)"


def raw_ops(store: Store, pages: Sequence[memoryview], buffers: Sequence[memoryview],
            next_keys: Keys, last_keys: Keys, all_keys: Keys, batch: int
            ) -> tuple[Op, Op, Op, str]:
    """Raw put, raw get (into ``buffers``), cleanup and the baseline's name for the backend."""
    if isinstance(store, MemoryStore):
        return _memcpy(pages, buffers, next_keys, last_keys)
    if isinstance(store, DirectoryStore):
        return _files(store.root.rstrip("/") + ".rawbench", pages, buffers, next_keys,
                      last_keys)
    client = getattr(store, "client", None)
    if client is not None and hasattr(client, "pipeline"):
        return _redis(client, pages, buffers, next_keys, last_keys, all_keys, batch)
    put, get, cleanup, _ = _memcpy(pages, buffers, next_keys, last_keys)
    return put, get, cleanup, f"memcpy (no native raw baseline for {type(store).__name__})"
