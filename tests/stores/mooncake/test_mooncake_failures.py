"""Mooncake cluster failures against real processes: the master SIGKILLed then restarted on
the same ports, a segment holder SIGKILLed. Store calls fail as ``StoreError`` within the
URL's ``timeout`` (never the client's 4.3 s), misses stay misses, nothing else raises."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from mooncake_cluster import MooncakeCluster

from radixlink.errors import StoreError
from radixlink.stores import open_store

from ..conformance import codec, key, payload

BUDGET_S = 0.5
SLACK_S = 1.0  # a loaded CI machine; the unbounded client call takes about 4.3 s


def _fails_within_budget(call: Callable[[], object]) -> None:
    started = time.monotonic()
    with pytest.raises(StoreError):
        call()
    assert time.monotonic() - started < BUDGET_S + SLACK_S


def _eventually(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except StoreError:
            pass
        assert time.monotonic() < deadline, "no recovery in time"
        time.sleep(0.2)


def test_killed_master_fails_every_call_within_budget_then_restart_is_a_clean_miss(
    cluster: MooncakeCluster,
) -> None:
    """Flow: pages stored -> master SIGKILLed -> exists, get_into, put, delete each raise
    StoreError within timeout= (the first from code -900, the rest from the budget: the
    client blocks about 4.3 s per call) -> master restarted empty on the same ports -> the
    same handle answers the old keys as clean misses (no error), and once the holder has
    mounted its segment again a put stores and a get returns the page."""
    store, c = open_store(cluster.url(timeout=str(BUDGET_S))), codec()
    pages = {key(i): c.encode(payload(i), key(i)) for i in range(4)}
    assert store.put(pages) == [True] * 4
    cluster.kill_master()
    buffers = [memoryview(bytearray(8192)) for _ in range(4)]
    _fails_within_budget(lambda: store.exists(list(pages)))
    _fails_within_budget(lambda: store.get_into(list(pages), buffers))
    _fails_within_budget(lambda: store.put({key(9): pages[key(0)]}))
    _fails_within_budget(lambda: store.delete([key(1)]))
    cluster.start_master()
    # NOTE: a read stuck in the client from before holds the staging until it returns
    _eventually(lambda: store.exists(list(pages)) == [False] * 4
                and store.get(list(pages)) == [None] * 4)
    _eventually(lambda: store.put({key(5): c.encode(payload(5), key(5))}) == [True])
    assert bytes(c.decode(store.get([key(5)])[0], key(5)) or b"") == payload(5)
    store.close()


def test_killed_segment_holder_is_an_error_then_a_miss(cluster: MooncakeCluster) -> None:
    """Flow: pages live in the holder's segment -> holder SIGKILLed -> reads raise StoreError
    (code -800, or the budget) or answer a miss, never bytes and never another exception ->
    after the master's client_ttl the keys are gone: clean misses; a new holder takes new
    pages."""
    store, c = open_store(cluster.url(timeout=str(BUDGET_S))), codec()
    pages = {key(i): c.encode(payload(i), key(i)) for i in range(4)}
    assert store.put(pages) == [True] * 4
    cluster.kill_holder()
    buffers = [memoryview(bytearray(8192)) for _ in range(4)]
    try:
        got = store.get_into(list(pages), buffers)
    except StoreError:  # code -800, or past the budget while the client finds the holder gone
        got = [None] * 4
    assert got == [None] * 4
    _eventually(lambda: store.exists(list(pages)) == [False] * 4
                and store.get(list(pages)) == [None] * 4)
    cluster.start_holder()
    _eventually(lambda: store.put({key(7): pages[key(0)]}) == [True])
    assert store.get([key(7)]) == [pages[key(0)]]
    store.close()


def test_open_with_no_master_fails_within_the_setup_retries(tmp_path) -> None:
    """A URL whose master is not listening: open raises StoreError after the one setup
    attempt of setup_retries=1 (about 4.4 s), not the client's default 90 s."""
    cluster = MooncakeCluster(tmp_path)  # ports chosen, nothing started
    started = time.monotonic()
    with pytest.raises(StoreError, match="setup failed"):
        open_store(cluster.url(setup_retries="1"))
    assert time.monotonic() - started < 30
