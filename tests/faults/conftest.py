"""Fixtures of the fault matrix: a memory store and a linker factory that closes what it built."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

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
