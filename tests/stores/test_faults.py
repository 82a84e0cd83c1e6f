"""The fault-injecting wrapper: seeded, adjustable at runtime, every fault counted."""

from __future__ import annotations

import time

import pytest

from radixlink.errors import StoreError
from radixlink.stores.faults import FaultyStore, InjectedFault
from radixlink.stores.memory import MemoryStore

from .conformance import codec, key, payload


def test_fail_raises_store_error_on_chosen_ops_only() -> None:
    """fail=1 raises StoreError (cause: InjectedFault) on the listed ops; others pass."""
    store = FaultyStore(MemoryStore(), fail=1.0, ops=["get"])
    assert store.put({key(0): b"v"}) == [True] and store.exists([key(0)]) == [True]
    with pytest.raises(StoreError) as info:
        store.get([key(0)])
    assert isinstance(info.value.__cause__, InjectedFault)
    store.fail = 0.0  # knobs are plain attributes
    assert store.get([key(0)]) == [b"v"]
    assert store.stats()["faults"]["failed_calls"] == 1


@pytest.mark.parametrize(("knob", "reason"), [("corrupt", "checksum"), ("truncate", "truncated")])
def test_damaged_gets_are_caught_by_the_codec(knob: str, reason: str) -> None:
    """corrupt flips a byte, truncate cuts the value; the codec counts both as misses."""
    c = codec()
    store = FaultyStore(MemoryStore(), seed=1, **{knob: 1.0})
    store.put({key(i): c.encode(payload(i), key(i)) for i in range(5)})
    blobs = store.get([key(i) for i in range(5)])
    assert [c.decode(blob, key(i)) for i, blob in enumerate(blobs)] == [None] * 5
    assert c.stats()["misses"] == 5 and c.stats()[reason] >= 1


def test_enospc_refuses_pages_and_counts_them() -> None:
    """enospc=1: put returns False per page, nothing reaches the inner store, all counted."""
    inner = MemoryStore()
    store = FaultyStore(inner, enospc=1.0)
    assert store.put({key(0): b"a", key(1): b"b"}) == [False, False]
    assert inner.exists([key(0), key(1)]) == [False, False]
    assert store.stats()["faults"]["enospc"] == 2


def test_same_seed_same_faults() -> None:
    """Two wrappers with one seed fail the same calls of the same call sequence."""

    def pattern(seed: int) -> list[bool]:
        store = FaultyStore(MemoryStore(), fail=0.5, seed=seed)
        outcome = []
        for _ in range(32):
            try:
                store.exists([key(0)])
                outcome.append(True)
            except StoreError:
                outcome.append(False)
        return outcome

    assert pattern(7) == pattern(7) and pattern(7) != pattern(8)


def test_delay_adds_latency_per_call() -> None:
    """delay_ms sleeps once per call of the chosen ops."""
    store = FaultyStore(MemoryStore(), delay_ms=30, ops=["exists"])
    started = time.monotonic()
    store.exists([key(0), key(1)])
    assert time.monotonic() - started >= 0.03
