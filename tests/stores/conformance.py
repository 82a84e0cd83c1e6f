"""The store contract, written once: every backend's test file mixes in ``BackendContract``.

A test file subclasses it and defines a ``backend`` fixture returning a ``Backend`` (how to
open the store, whether it persists across reopen, whether its LRU is exact).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from radixlink.contract import PoolName
from radixlink.stores import PageCodec, Store, page_key
from radixlink.stores.codec import HEADER_BYTES
from radixlink.stores.keys import KEY_PREFIX

PAGE_BYTES = 4096
NAMESPACE = "c0ffee"


@dataclass
class Backend:
    """How a test file opens its store. ``make(capacity_bytes or None)`` opens a new handle on
    the same underlying storage each call."""

    make: Callable[[int | None], Store]
    persistent: bool
    exact_lru: bool = True
    opened: list[Store] = field(default_factory=list)

    def open(self, capacity_bytes: int | None = None) -> Store:
        store = self.make(capacity_bytes)
        self.opened.append(store)
        return store


def closing(backend: Backend) -> Iterator[Backend]:
    """Yield ``backend`` and close every store it opened (use from a fixture)."""
    yield backend
    for store in backend.opened:
        store.close()


def key(i: int, namespace: str = NAMESPACE) -> str:
    return page_key(namespace, f"{i:064x}", PoolName.KV)


def payload(i: int, size: int = PAGE_BYTES) -> bytes:
    return random.Random(i).randbytes(size)


def codec(page_bytes: int = PAGE_BYTES) -> PageCodec:
    return PageCodec("layout-test", page_bytes)


class BackendContract:
    """The behaviour every store must have (DESIGN.md section 6b)."""

    def test_round_trip(self, backend: Backend) -> None:
        """Pages put through the codec come back byte-identical from get."""
        store, c = backend.open(), codec()
        assert store.put({key(i): c.encode(payload(i), key(i)) for i in range(8)}) == [True] * 8
        blobs = store.get([key(i) for i in range(8)])
        got = [bytes(c.decode(blob, key(i)) or b"") for i, blob in enumerate(blobs)]
        assert got == [payload(i) for i in range(8)]

    def test_get_into_lands_values_in_caller_buffers(self, backend: Backend) -> None:
        """get_into copies each value into its buffer and returns its length; a missing key is
        None; a value longer than its buffer fills it with its head and reports its length."""
        store, c = backend.open(), codec()
        blobs = {key(i): c.encode(payload(i), key(i)) for i in range(3)}
        store.put(blobs)
        size = len(blobs[key(0)])
        arena = bytearray(4 * size)
        view = memoryview(arena)
        buffers = [view[0:size], view[size : 2 * size], view[2 * size : 3 * size],
                   view[3 * size : 3 * size + 100]]
        sizes = store.get_into([key(0), key(9), key(2), key(1)], buffers)
        assert sizes == [size, None, size, size]
        assert bytes(buffers[0]) == blobs[key(0)] and bytes(buffers[2]) == blobs[key(2)]
        assert bytes(buffers[3]) == blobs[key(1)][:100]
        assert bytes(c.decode(buffers[0], key(0)) or b"") == payload(0)

    def test_get_scattered_fills_pieces_in_order(self, backend: Backend) -> None:
        """get_scattered spreads each value over its pieces one after another, as one readv:
        a page's header, its payload in uneven pieces, its tail; a missing key is None and
        leaves its pieces as they were; a longer value fills the pieces with its head, a
        shorter one a prefix of them, and both report their length."""
        store, c = backend.open(), codec()
        blobs = {key(i): c.encode(payload(i), key(i)) for i in range(3)}
        store.put(blobs)
        size = len(blobs[key(0)])
        cuts = [0, HEADER_BYTES, HEADER_BYTES + 1, HEADER_BYTES + 1000, size - 5, size]

        def pieces(total: int) -> list[memoryview]:
            view = memoryview(bytearray(b"\xee" * total))
            bounds = [min(cut, total) for cut in cuts] + [total]
            return [view[a:b] for a, b in zip(bounds, bounds[1:])]

        targets = [pieces(size), pieces(size), pieces(size - 100), pieces(size + 50)]
        sizes = store.get_scattered([key(0), key(9), key(1), key(2)], targets)
        assert sizes == [size, None, size, size]
        assert b"".join(map(bytes, targets[0])) == blobs[key(0)]
        assert b"".join(map(bytes, targets[1])) == b"\xee" * size
        assert b"".join(map(bytes, targets[2])) == blobs[key(1)][: size - 100]
        assert b"".join(map(bytes, targets[3])) == blobs[key(2)] + b"\xee" * 50
        assert c.verify_scattered(targets[0][0], targets[0][1:], memoryview(b""), size,
                                  key(0)) is None

    def test_get_scattered_hands_each_value_over_before_the_next(self,
                                                               backend: Backend) -> None:
        """get_scattered's ``each(i, size)`` runs once per key, in order, on the calling
        thread, when value i is in its pieces and value i + 1 is not yet (a load checks each
        page while it is in cache); an exception it raises ends the call and propagates."""
        store, c = backend.open(), codec()
        blobs = {key(i): c.encode(payload(i), key(i)) for i in range(3)}
        store.put(blobs)
        size = len(blobs[key(0)])
        keys = [key(0), key(9), key(1), key(2)]
        targets = [[memoryview(bytearray(size))] for _ in keys]
        seen: list[tuple[int, int | None, bool, bool]] = []

        def each(i: int, got: int | None) -> None:
            filled = got is not None and bytes(targets[i][0]) == blobs[keys[i]]
            later = any(bytes(t[0]) != bytes(size) for t in targets[i + 1 :])
            seen.append((i, got, filled, later))

        assert store.get_scattered(keys, targets, each) == [size, None, size, size]
        assert seen == [(0, size, True, False), (1, None, False, False),
                        (2, size, True, False), (3, size, True, False)]

        def stop(i: int, got: int | None) -> None:
            raise RuntimeError(f"stop at {i}")

        with pytest.raises(RuntimeError, match="stop at 0"):
            store.get_scattered(keys, [[memoryview(bytearray(size))] for _ in keys], stop)
        assert store.get([key(1)]) == [blobs[key(1)]]  # the store goes on

    def test_put_of_views_copies_before_returning(self, backend: Backend) -> None:
        """put takes memoryviews into a buffer the caller reuses right after: the store keeps
        the bytes as they were at put time, never a reference to the buffer."""
        store, c = backend.open(), codec()
        pages = [c.encode(payload(i), key(i)) for i in range(4)]
        staging = bytearray(b"".join(pages))
        view, size = memoryview(staging), len(pages[0])
        assert store.put({key(i): view[i * size : (i + 1) * size] for i in range(4)}) == [True] * 4
        staging[:] = bytes(len(staging))  # the caller reuses its staging buffer
        store.flush()
        assert store.get([key(i) for i in range(4)]) == pages

    def test_batch_presence(self, backend: Backend) -> None:
        """exists answers per key, in order, for a batch mixing stored and missing keys."""
        store = backend.open()
        store.put({key(i): codec().encode(payload(i), key(i)) for i in (0, 2, 3)})
        assert store.exists([key(i) for i in range(5)]) == [True, False, True, True, False]

    def test_missing_keys(self, backend: Backend) -> None:
        """Missing keys are an expected no: None / False / 0 deleted; empty batches work."""
        store = backend.open()
        assert store.get([key(7), key(8)]) == [None, None]
        assert store.exists([key(7)]) == [False]
        assert store.delete([key(7)]) == 0
        assert store.get([]) == [] and store.exists([]) == [] and store.put({}) == []

    def test_overwrite_and_delete(self, backend: Backend) -> None:
        """A second put of a key replaces the value; delete removes exactly what exists."""
        store, c = backend.open(), codec()
        store.put({key(1): c.encode(payload(1), key(1))})
        assert store.put({key(1): c.encode(payload(2), key(1))}) == [True]
        assert bytes(c.decode(store.get([key(1)])[0], key(1)) or b"") == payload(2)
        assert store.delete([key(1), key(9)]) == 1
        assert store.exists([key(1)]) == [False]

    def test_atomic_page_under_concurrent_writes(self, backend: Backend) -> None:
        """A reader racing writers of the same key sees a whole old or new page, never a part."""
        size = 1 << 20
        store, c = backend.open(), codec(size)
        versions = [c.encode(payload(100 + v, size), key(0)) for v in range(2)]
        store.put({key(0): versions[0]})
        stop = threading.Event()

        def write(version: bytes) -> None:
            while not stop.is_set():
                store.put({key(0): version})

        writers = [threading.Thread(target=write, args=(v,)) for v in versions]
        for thread in writers:
            thread.start()
        try:
            deadline, num_reads = time.monotonic() + 0.3, 0
            while time.monotonic() < deadline or num_reads < 20:
                assert store.get([key(0)])[0] in versions
                num_reads += 1
        finally:
            stop.set()
            for thread in writers:
                thread.join()

    def test_capacity_eviction(self, backend: Backend) -> None:
        """Past capacity the store evicts; the newest page stays (exact LRU: the least recently
        used pages go first, and a get counts as a use)."""
        c = codec()
        blob_len = len(c.encode(payload(0), key(0)))
        if backend.exact_lru:
            store = backend.open(10 * blob_len)
            store.put({key(i): c.encode(payload(i), key(i)) for i in range(8)})
            assert store.get([key(0)])[0] is not None
            store.put({key(i): c.encode(payload(i), key(i)) for i in range(8, 12)})
            assert store.exists([key(i) for i in range(12)]) == [True, False, False] + [True] * 9
            return
        store = backend.open(64 * blob_len)
        for start in range(0, 512, 8):
            store.put({key(i): c.encode(payload(i), key(i)) for i in range(start, start + 8)})
        present = store.exists([key(i) for i in range(512)])
        assert 0 < sum(present) < 512 and present[-1]

    def test_corrupt_payload_is_a_counted_miss(self, backend: Backend) -> None:
        """Bytes damaged in the store (a flipped byte, a cut tail) decode as counted misses."""
        store, c = backend.open(), codec()
        good = c.encode(payload(5), key(5))
        flipped = good[:100] + bytes([good[100] ^ 1]) + good[101:]
        store.put({key(5): flipped, key(6): c.encode(payload(6), key(6))[:-10]})
        blobs = store.get([key(5), key(6)])
        assert [c.decode(blob, k) for blob, k in zip(blobs, [key(5), key(6)])] == [None, None]
        assert c.stats()["checksum"] == 1 and c.stats()["truncated"] == 1

    def test_close_and_reopen(self, backend: Backend) -> None:
        """After close, a new handle sees the pages if the backend persists, else nothing."""
        store, c = backend.open(), codec()
        store.put({key(3): c.encode(payload(3), key(3))})
        store.close()
        assert backend.open().exists([key(3)]) == [backend.persistent]

    def test_scan_and_clear_by_namespace(self, backend: Backend) -> None:
        """scan lists (key, size) under a prefix; clear(prefix) removes only those keys."""
        store, c = backend.open(), codec()
        store.put({key(i, "aaaa"): c.encode(payload(i), key(i, "aaaa")) for i in range(3)})
        store.put({key(i, "bbbb"): c.encode(payload(i), key(i, "bbbb")) for i in range(2)})
        listed = sorted(store.scan(f"{KEY_PREFIX}aaaa/"))
        assert listed == sorted((key(i, "aaaa"), PAGE_BYTES + HEADER_BYTES) for i in range(3))
        assert store.clear(f"{KEY_PREFIX}aaaa/") == 3
        assert store.exists([key(0, "aaaa"), key(0, "bbbb"), key(1, "bbbb")]) == [
            False,
            True,
            True,
        ]

    def test_concurrent_batches_from_threads(self, backend: Backend) -> None:
        """Threads putting and getting disjoint batches at once all read back their own pages."""
        store, c = backend.open(), codec()
        errors: list[BaseException] = []

        def work(t: int) -> None:
            try:
                keys = [key(1000 * t + i) for i in range(16)]
                store.put({k: c.encode(payload(1000 * t + i), k) for i, k in enumerate(keys)})
                blobs = store.get(keys)
                got = [bytes(c.decode(b, k) or b"") for b, k in zip(blobs, keys, strict=True)]
                assert got == [payload(1000 * t + i) for i in range(16)]
            except BaseException as exc:  # reported to the main thread below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
