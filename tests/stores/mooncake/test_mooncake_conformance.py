"""The conformance suite against a real Mooncake master and segment holder, with the
deviations docs/stores.md ("Mooncake Store") explains marked where they are overridden."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from mooncake_cluster import MooncakeCluster

from radixlink.stores import Store, open_store

from ..conformance import Backend, BackendContract, closing, codec, key, payload


class TestMooncakeStore(BackendContract):
    @pytest.fixture
    def backend(self, mooncake_url: str) -> Iterator[Backend]:
        # NOTE: deviation: capacity is the cluster's (the holders' segments), not a handle's
        def make(cap: int | None) -> Store:
            return open_store(mooncake_url)

        yield from closing(Backend(make, persistent=True, exact_lru=False))

    def test_atomic_page_under_concurrent_writes(self, backend: Backend) -> None:
        """Deviation: a replace is remove + put (Mooncake's put keeps the old value, upsert
        tears pages), so a reader racing writers may see a miss; whatever it decodes is a whole
        old or new page, never a part."""
        size = 1 << 20
        store, c = backend.open(), codec(size)
        versions = [c.encode(payload(100 + v, size), key(0)) for v in range(2)]
        bodies = [payload(100 + v, size) for v in range(2)]
        store.put({key(0): versions[0]})
        stop = threading.Event()

        def write(version: bytes) -> None:
            while not stop.is_set():
                store.put({key(0): version})

        writers = [threading.Thread(target=write, args=(v,)) for v in versions]
        for thread in writers:
            thread.start()
        whole = 0
        try:
            deadline, num_reads = time.monotonic() + 0.5, 0
            while time.monotonic() < deadline or num_reads < 20:
                blob = store.get([key(0)])[0]
                page = None if blob is None else c.decode(blob, key(0))
                assert page is None or bytes(page) in bodies
                whole += page is not None
                num_reads += 1
        finally:
            stop.set()
            for thread in writers:
                thread.join()
        assert whole > 0 and store.get([key(0)])[0] in versions

    def test_capacity_eviction(self, backend: Backend, session_cluster: MooncakeCluster
                               ) -> None:
        """Deviation: the capacity is the holders' segments (32 MiB here): writing past it
        evicts in the background (puts fail meanwhile, per page, never raising); once the
        pages are deleted, a put stores its pages again."""
        size = 256 << 10
        store, c = backend.open(), codec(size)
        num_pages = 192  # 48 MiB
        page = c.encode(payload(1, size), key(0))
        results: list[bool] = []
        for start in range(0, num_pages, 16):
            results += store.put({key(i): page for i in range(start, start + 16)})
        present = store.exists([key(i) for i in range(num_pages)])
        assert 0 < sum(present) < num_pages, sum(present)
        assert sum(results) >= sum(present)
        store.delete([key(i) for i in range(num_pages)])
        fresh = {key(i): page for i in range(num_pages, num_pages + 8)}
        assert store.put(fresh) == [True] * 8
        assert store.exists(list(fresh)) == [True] * 8


def test_staged_put_round_trips_replaces_and_refuses_oversized(mooncake_url: str) -> None:
    """direct_put=false (the RDMA path: pages copied into the registered staging first):
    views of a buffer the caller then reuses come back as put; a replace wins; a page larger
    than the staging is a counted False, its batch neighbours stored."""
    with open_store(f"{mooncake_url}&direct_put=false&staging=1MiB") as store:
        c = codec()
        pages = [c.encode(payload(i), key(i)) for i in range(4)]
        staging = bytearray(b"".join(pages))
        view, size = memoryview(staging), len(pages[0])
        assert store.put({key(i): view[i * size : (i + 1) * size] for i in range(4)}) == [True] * 4
        staging[:] = bytes(len(staging))
        assert store.get([key(i) for i in range(4)]) == pages
        assert store.put({key(0): pages[1]}) == [True] and store.get([key(0)]) == [pages[1]]
        big = bytes(2 << 20)
        assert store.put({key(5): pages[2], key(6): big, key(7): pages[3]}) == [True, False, True]
        assert store.exists([key(5), key(6), key(7)]) == [True, False, True]
        assert store.stats()["put_failures"] == 1
