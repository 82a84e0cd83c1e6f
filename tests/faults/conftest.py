"""Fixtures of the fault matrix: a memory store, a linker factory that closes what it built, and
a redis-server of the test's own (``server``) for tests that pause it."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis_server import MISSING_REASON, REDIS_SERVER, RedisServer

from radixlink.linker.core import ExternalCacheLinker
from radixlink.stores.memory import MemoryStore


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore(capacity_bytes=64 << 20)


@pytest.fixture
def link() -> Iterator[Callable[..., ExternalCacheLinker]]:
    """``link(cache, store, **options)``: an attached linker, closed at teardown."""
    built: list[ExternalCacheLinker] = []

    def make(cache: Any, store: Any, **options: Any) -> ExternalCacheLinker:
        linker = ExternalCacheLinker(cache, store, **options)
        built.append(linker)
        return linker

    yield make
    for linker in built:
        linker.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own (tests pause it: pausing the session's would stall
    other tests); resumed and stopped by PID at teardown."""
    if REDIS_SERVER is None:
        pytest.skip(MISSING_REASON)
    pytest.importorskip("redis")
    server = RedisServer(tmp_path / "redis").start()
    yield server
    if server.proc is not None and server.proc.poll() is None:
        os.kill(server.proc.pid, signal.SIGCONT)
    server.stop()
