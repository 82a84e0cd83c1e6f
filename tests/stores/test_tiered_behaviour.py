"""The tiered store: promotion on back hits, write-behind drained by flush/close, and a failing
back store degrading to the front."""

from __future__ import annotations

from pathlib import Path

from radixlink.stores.directory import DirectoryStore
from radixlink.stores.faults import FaultyStore
from radixlink.stores.memory import MemoryStore
from radixlink.stores.tiered import TieredStore

from .conformance import key


def test_back_hit_is_promoted_into_the_front(tmp_path: Path) -> None:
    """A page only the back holds is served and copied into the front."""
    back = DirectoryStore(tmp_path)
    back.put({key(1): b"from disk"})
    store = TieredStore(MemoryStore(), back)
    assert store.get([key(1), key(2)]) == [b"from disk", None]
    assert store.front.exists([key(1)]) == [True] and store.stats()["back_hits"] == 1
    store.close()


def test_writes_reach_the_back_by_flush_and_by_close(tmp_path: Path) -> None:
    """put returns after the front write; flush() and close() drain the write-behind queue."""
    store = TieredStore(MemoryStore(), DirectoryStore(tmp_path))
    assert store.put({key(i): b"p" for i in range(20)}) == [True] * 20
    store.flush()
    assert DirectoryStore(tmp_path).exists([key(i) for i in range(20)]) == [True] * 20
    store.put({key(99): b"late"})
    store.close()
    assert DirectoryStore(tmp_path).get([key(99)]) == [b"late"]


def test_failing_back_degrades_to_front_only() -> None:
    """With the back store failing every call, the front keeps serving and errors are counted."""
    back = FaultyStore(MemoryStore(), fail=1.0, ops=["exists", "get", "put"])
    store = TieredStore(MemoryStore(), back)
    assert store.put({key(0): b"v"}) == [True]
    assert store.get([key(0), key(1)]) == [b"v", None]
    assert store.exists([key(0), key(1)]) == [True, False]
    store.flush()
    stats = store.stats()
    assert stats["back_errors"] >= 3 and stats["back_put_failures"] == 1
    store.close()
