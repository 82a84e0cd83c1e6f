"""``pages.pageio``, the one page I/O unit: key templates (``pages.keys``) byte-identical to
``page_key``, a
batched read into caller frames with every bad page counted and the present ones deleted, a
write from staging that skips present pages but never a bad one, and the presence query."""

from __future__ import annotations

import pytest
import torch

from radixlink.contract import PoolName
from radixlink.hashing import Namespace, namespace_id
from radixlink.pages import pageio
from radixlink.pages.keys import PageKeys
from radixlink.pages.staging import StagingArena, frame_stride
from radixlink.stores.faults import FaultyStore
from radixlink.stores.keys import page_key
from radixlink.stores.memory import MemoryStore

PAGE = 64
HASHES = [f"{i:016x}" for i in range(6)]


def _pages(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, PAGE), dtype=torch.uint8, generator=gen)


def _save(store: MemoryStore, codec: pageio.Codec, keys: list[str], data: torch.Tensor,
          arena: StagingArena, **kw: object) -> pageio.WriteResult:
    staging, parts = pageio.stage_pages(arena, [(codec, keys)])
    try:
        parts[0].frames.payloads().copy_(data)
        return pageio.write(store, parts, **kw)  # type: ignore[arg-type]
    finally:
        arena.release(*staging)


class _FailingRead(MemoryStore):
    """A memory store whose ``fail_at``-th ``get_into`` raises (0: none does)."""

    def __init__(self, fail_at: int) -> None:
        super().__init__(1 << 20)
        self.fail_at, self.reads = fail_at, 0

    def get_into(self, keys, buffers):  # type: ignore[no-untyped-def]
        self.reads += 1
        if self.reads == self.fail_at:
            raise OSError("the store went away")
        return super().get_into(keys, buffers)

    def get_scattered(self, keys, targets, each=None):  # type: ignore[no-untyped-def]
        self.reads += 1
        if self.reads == self.fail_at:
            raise OSError("the store went away")
        return super().get_scattered(keys, targets, each)


def _two_pools(store: MemoryStore, arena: StagingArena
               ) -> tuple[list[pageio.Codec], list[list[str]], list[torch.Tensor]]:
    """Two pools saved to ``store``: 6 KV pages and 3 SWA pages (codecs, keys, payloads)."""
    codecs = [pageio.make_codec("fp", PAGE), pageio.make_codec("fp2", PAGE)]
    keys = [PageKeys().keys(PoolName.KV, HASHES, "ab"),
            PageKeys().keys(PoolName.SWA, HASHES[:3], "ab")]
    data = [_pages(6, seed=1), _pages(3, seed=2)]
    for codec, k, d in zip(codecs, keys, data):
        assert _save(store, codec, k, d, arena).ok
    return codecs, keys, data


def _damage(store: MemoryStore, keys: list[str]) -> None:
    """Page 1: a payload byte flipped; page 4: cut short; page 5: gone."""
    flipped = bytearray(store.get([keys[1]])[0])
    flipped[-1] ^= 0xFF
    cut = store.get([keys[4]])[0]
    store.put({keys[1]: bytes(flipped), keys[4]: cut[:40]})
    store.delete([keys[5]])


def test_key_templates_are_the_bytes_of_page_key() -> None:
    ns = namespace_id(Namespace(model="m", layout="l"))
    for ns_id, pool, rank in [(ns, PoolName.KV, 0), (ns, PoolName.SWA, 3), ("", "mamba", None),
                              (ns, PoolName.MAMBA, None)]:
        keyspace = PageKeys(rank or 0, () if rank is not None else {PoolName(pool)})
        assert keyspace.keys(PoolName(pool), HASHES, ns_id) == [
            page_key(ns_id, h, pool, rank) for h in HASHES]
    keys = PageKeys(2, {PoolName.KV})
    assert keys.keys(PoolName.KV, HASHES[:1], None) == [page_key(namespace_id(None), HASHES[0],
                                                                 PoolName.KV)]
    assert keys.keys(PoolName.SWA, HASHES[:1], ns) == [page_key(ns, HASHES[0], PoolName.SWA, 2)]
    assert not keys.writes(PoolName.KV) and keys.writes(PoolName.SWA)
    fixed = PageKeys(2, namespace=ns)  # a fixed namespace: calls name none
    assert fixed.keys(PoolName.SWA, HASHES) == keys.keys(PoolName.SWA, HASHES, ns)
    assert fixed.namespace_id == ns and fixed.keys(PoolName.KV, []) == []
    with pytest.raises(ValueError, match="rank"):
        PageKeys(-1)
    with pytest.raises(ValueError, match="pool"):
        PageKeys().keys("nope", HASHES, ns)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="page hash '../x'"):
        PageKeys().keys(PoolName.KV, ["ab", "../x"], ns)


def test_two_bad_pages_are_counted_deleted_and_rewritten_by_the_next_save() -> None:
    """A batch of 6 pages with a corrupt one (position 1), a truncated one (4) and a missing
    one (5): every one is a miss with its reason, both present bad pages are deleted (the
    others stay), the verified payloads sit in the caller's frames, and the next save that
    skips present pages still writes all three."""
    store, arena = MemoryStore(1 << 20), StagingArena()
    codec = pageio.make_codec("fp", PAGE)
    keys = PageKeys().keys(PoolName.KV, HASHES, "ab")
    data = _pages(6, seed=1)
    assert _save(store, codec, keys, data, arena).stored == keys
    _damage(store, keys)
    bad = pageio.BadKeys()
    staging, parts = pageio.stage_pages(arena, [(codec, keys)])
    read = pageio.read(store, parts, bad=bad)
    assert read.reasons == [None, "checksum", None, None, "truncated", "missing"]
    assert read.misses() == {"checksum": 1, "truncated": 1, "missing": 1}
    assert read.bad_keys == [keys[1], keys[4]] and not read.ok
    assert store.exists(keys) == [True, False, True, True, False, False]
    rows = parts[0].frames.payloads()
    assert all(torch.equal(rows[i], data[i]) for i in (0, 2, 3))
    assert codec.stats()["checksum"] == 1 and codec.stats()["truncated"] == 1
    arena.release(*staging)
    written = _save(store, codec, keys, data, arena, skip_present=True, bad=bad)
    assert sorted(written.stored) == sorted([keys[1], keys[4], keys[5]])
    assert written.skipped == 3 and written.healed == 2 and written.ok
    staging, parts = pageio.stage_pages(arena, [(codec, keys)])
    assert pageio.read(store, parts).ok
    assert torch.equal(parts[0].frames.payloads().clone(), data)
    arena.release(*staging)


@pytest.mark.parametrize("held", ["all", "some", "all but a bad one"])
def test_a_skip_present_offload_gathers_nothing_when_the_store_holds_every_page(
        held: str) -> None:
    """An OFFLOAD job with ``skip_present`` asks the store first: when it holds every page
    the job ends there (no fill, no put, every page counted skipped); otherwise the pages are
    gathered and only the missing ones sent, with one presence query. A key found bad here
    reads absent, so it is gathered and rewritten."""
    from radixlink.pages.engine import Job, TransferEngine, TransferKind

    store, arena = _CountingPuts(1 << 20), StagingArena()
    codec = pageio.make_codec("fp", PAGE)
    keys = PageKeys().keys(PoolName.KV, HASHES, "ab")
    data = _pages(6, seed=4)
    _save(store, codec, keys, data, arena)
    if held == "some":
        store.delete(keys[4:])
    engine = TransferEngine(store, 1, arena)
    try:
        if held == "all but a bad one":
            engine.bad.add([keys[2]])
        staging, parts = pageio.stage_pages(arena, [(codec, keys)])
        fills: list[int] = []

        def fill() -> None:
            fills.append(1)
            parts[0].frames.payloads().copy_(data)

        store.puts = store.queries = 0
        done = engine.run(Job(kind=TransferKind.OFFLOAD, parts=parts, staging=staging,
                              fill=fill, skip_present=True))
        stats = engine.stats()
    finally:
        engine.close()
    assert done.ok and done.written is not None and store.queries == 1
    sent = {"all": [], "some": keys[4:], "all but a bad one": [keys[2]]}[held]
    assert sorted(done.written.stored) == sorted(sent) and done.written.skipped == 6 - len(sent)
    assert (len(fills), store.puts) == ((0, 0) if held == "all" else (1, 1))
    assert stats["skipped_pages"] == 6 - len(sent) and stats["saved_pages"] == len(sent)
    assert store.exists(keys) == [True] * 6


class _CountingPuts(MemoryStore):
    """A memory store that counts ``put`` and ``exists`` calls."""

    puts = queries = 0

    def put(self, items):  # type: ignore[no-untyped-def]
        self.puts += 1
        return super().put(items)

    def exists(self, keys):  # type: ignore[no-untyped-def]
        self.queries += 1
        return super().exists(keys)


def test_a_bad_page_whose_delete_fails_reads_absent_and_is_overwritten() -> None:
    """The delete fails (a store error, logged): the bad keys still read absent to the
    presence query and the next skip-present save overwrites them."""
    inner, arena = MemoryStore(1 << 20), StagingArena()
    store = FaultyStore(inner, ops=("delete",), fail=1.0)
    codec = pageio.make_codec("fp", PAGE)
    keys = PageKeys().keys(PoolName.KV, HASHES, "ab")
    data = _pages(6, seed=2)
    _save(inner, codec, keys, data, arena)
    _damage(inner, keys)
    bad = pageio.BadKeys()
    staging, parts = pageio.stage_pages(arena, [(codec, keys)])
    assert pageio.read(store, parts, bad=bad).bad_keys == [keys[1], keys[4]]
    arena.release(*staging)
    assert inner.exists(keys) == [True, True, True, True, True, False]  # not deleted
    flags = pageio.present(store, keys, bad)
    assert flags == [True, False, True, True, False, False]
    assert pageio.leading_present(flags) == 1
    written = _save(store, codec, keys, data, arena, skip_present=True, bad=bad)
    assert sorted(written.stored) == sorted([keys[1], keys[4], keys[5]]) and written.healed == 2
    assert pageio.present(store, keys, bad) == [True] * 6


def test_a_page_of_another_layout_or_key_is_a_miss_and_deleted() -> None:
    """Foreign pages: one written under another key, one of another layout fingerprint."""
    store, arena = MemoryStore(1 << 20), StagingArena()
    codec = pageio.make_codec("fp", PAGE)
    keys = PageKeys().keys(PoolName.KV, HASHES[:3], "ab")
    data = _pages(3, seed=3)
    _save(store, codec, keys, data, arena)
    _save(store, pageio.make_codec("other", PAGE), keys[2:], data[2:], arena)
    store.put({keys[0]: store.get([keys[1]])[0]})
    staging, parts = pageio.stage_pages(arena, [(codec, keys)])
    read = pageio.read(store, parts)
    arena.release(*staging)
    assert read.reasons == ["key", None, "fingerprint"]
    assert store.exists(keys) == [False, True, False]


@pytest.mark.parametrize("chunk_pages", [1, 2, 4, 100])
def test_a_load_read_in_chunks_has_the_verdict_order_and_bytes_of_one_read(
        chunk_pages: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The transfer engine reads a batch over ``CHUNK_BYTES`` chunk by chunk, verifying each
    on its verify threads while it reads the next: two pools (6 and 3 pages) with the damage
    of ``_damage`` in the first come out with every reason in page order, the present bad
    pages deleted, the good payloads in their frames, and the job MISSING (a page is gone);
    undamaged, OK with every byte in place."""
    from radixlink.pages import stream as stream_module
    from radixlink.pages.engine import Job, TransferEngine, TransferKind, TransferStatus

    store, arena = MemoryStore(1 << 20), StagingArena()
    codecs, keys, data = _two_pools(store, arena)
    staging, parts = pageio.stage_pages(arena, list(zip(codecs, keys)))
    monkeypatch.setattr(stream_module, "CHUNK_BYTES", chunk_pages * parts[0].frames.stride)
    engine = TransferEngine(store, 2, arena)
    try:
        done = engine.run(Job(kind=TransferKind.LOAD, parts=parts, staging=staging))
        assert done.ok and done.read is not None and done.read.reasons == [None] * 9
        for part, d in zip(parts, data):
            assert torch.equal(part.frames.payloads().clone(), d)
        engine.release(Job(kind=TransferKind.LOAD, parts=parts, staging=staging))
        _damage(store, keys[0])
        staging, parts = pageio.stage_pages(arena, list(zip(codecs, keys)))
        done = engine.run(Job(kind=TransferKind.LOAD, parts=parts, staging=staging))
        assert done.status is TransferStatus.MISSING and done.read is not None
        assert done.read.reasons == [None, "checksum", None, None, "truncated", "missing",
                                     None, None, None]
        assert done.read.bad_keys == [keys[0][1], keys[0][4]]
        assert store.exists(keys[0]) == [True, False, True, True, False, False]
        rows = parts[0].frames.payloads()
        assert all(torch.equal(rows[i], data[0][i]) for i in (0, 2, 3))
        assert torch.equal(parts[1].frames.payloads().clone(), data[1])
        assert (engine._verify is None) == (chunk_pages >= 9)  # one chunk: no verify threads
    finally:
        engine.close()


def test_a_job_reports_its_threads_cpu_time_apart_from_its_wall_time() -> None:
    """A completion's ``cpu_seconds`` is the CPU time of the thread that ran the job, so a
    load's log can tell its own work from its waits: a load whose store answers after 150 ms
    of sleep has that in ``seconds`` and not in ``cpu_seconds``."""
    from radixlink.pages.engine import Job, TransferEngine, TransferKind

    inner, arena = MemoryStore(1 << 20), StagingArena()
    codecs, keys, data = _two_pools(inner, arena)
    store = FaultyStore(inner, delay_ms=150.0, ops=("get",))
    engine = TransferEngine(store, 1, arena)
    try:
        staging, parts = pageio.stage_pages(arena, list(zip(codecs, keys)))
        done = engine.run(Job(kind=TransferKind.LOAD, parts=parts, staging=staging))
        engine.release(Job(kind=TransferKind.LOAD, parts=parts, staging=staging))
    finally:
        engine.close()
    assert done.ok and done.seconds >= 0.15
    assert 0.0 < done.cpu_seconds < done.seconds - 0.1


def test_a_chunked_load_whose_read_fails_returns_only_once_no_chunk_is_being_verified(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A store error on the second chunk ends the load as STORE_ERROR, but only after the
    first chunk's verification finished: the job's staging goes back to the arena when it
    returns, and a verify thread still reading it could see another job's bytes (and delete a
    good page as bad)."""
    import threading
    import time

    from radixlink.pages import stream as stream_module
    from radixlink.pages.engine import Job, TransferEngine, TransferKind, TransferStatus

    store, arena = _FailingRead(2), StagingArena()
    codec = pageio.make_codec("fp", PAGE)
    keys = PageKeys().keys(PoolName.KV, HASHES, "ab")
    assert _save(store, codec, keys, _pages(6, seed=1), arena).ok
    running = threading.Event()
    real_check = pageio.check

    def slow_check(*args, **kwargs):  # type: ignore[no-untyped-def]
        running.set()
        time.sleep(0.3)
        result = real_check(*args, **kwargs)
        running.clear()
        return result

    monkeypatch.setattr(pageio, "check", slow_check)
    staging, parts = pageio.stage_pages(arena, [(codec, keys)])
    monkeypatch.setattr(stream_module, "CHUNK_BYTES", 3 * parts[0].frames.stride)
    engine = TransferEngine(store, 1, arena)
    try:
        done = engine.run(Job(kind=TransferKind.LOAD, parts=parts, staging=staging))
        assert done.status is TransferStatus.STORE_ERROR and "went away" in done.detail
        assert not running.is_set(), "a chunk was still being verified when the load ended"
    finally:
        engine.close()


class _CountingArena(StagingArena):
    """An arena that counts the buffers out at once (the most, and now)."""

    def __init__(self) -> None:
        super().__init__()
        self.out = self.most = 0

    def acquire(self, nbytes: int):  # type: ignore[no-untyped-def]
        self.out += 1
        self.most = max(self.most, self.out)
        return super().acquire(nbytes)

    def release(self, buffer, view) -> None:  # type: ignore[no-untyped-def]
        self.out -= 1
        super().release(buffer, view)


def _streamed(store: MemoryStore, codecs: list[pageio.Codec], keys: list[list[str]],
              arena: StagingArena, land=None, direct: bool = False):  # type: ignore[no-untyped-def]
    """A streamed LOAD of two pools into fresh host rows: (completion, rows per pool, spans
    landed, whether verify threads ran). ``direct``: each page read straight into its row,
    in two pieces (``Stream.targets``); the spans are then those it was asked for."""
    from radixlink.pages.engine import Job, TransferEngine, TransferKind
    from radixlink.pages.stream import Stream

    rows = [torch.zeros(len(k), PAGE, dtype=torch.uint8) for k in keys]
    landed: list[tuple[int, int, int]] = []

    def copy(spans, piece, read) -> None:  # type: ignore[no-untyped-def]
        page = 0
        for (pool, first, count), part in zip(spans, piece, strict=True):
            for i in range(count):
                if read.reasons[page + i] is None:
                    rows[pool][first + i] = part.frames.payloads()[i]
            page += count
        landed.extend(spans)

    def targets(span):  # type: ignore[no-untyped-def]
        pool, first, count = span
        landed.append(span)
        views = [memoryview(rows[pool][first + i].numpy()) for i in range(count)]
        return [(view[:10], view[10:]) for view in views]

    engine = TransferEngine(store, 2, arena)
    try:
        stream = Stream(list(zip(codecs, keys)), land or copy, targets if direct else None)
        done = engine.run(Job(kind=TransferKind.LOAD, parts=(), stream=stream))
    finally:
        engine.close()
    return done, rows, landed, engine._verify is not None


@pytest.mark.parametrize("path", ["staging", "direct"])
@pytest.mark.parametrize("cores", ["one", "all"])
@pytest.mark.parametrize("chunk_pages", [1, 2, 100])
def test_a_streamed_load_lands_each_verified_chunk_with_bounded_staging(
        chunk_pages: int, cores: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A streamed load reads each chunk into staging of its own, verifies it and hands it to
    ``Stream.land``, on a verify thread while the next is read when the thread may run on
    more than one core, else each in turn: two pools (6 and 3 pages) land every page, in
    spans that cover each pool once; with the damage of ``_damage`` the reasons come in page
    order and no bad page lands. At most ``STREAM_WINDOW`` + 1 chunks of staging are out at
    once (one on one core), and none is out when the job ends.

    ``direct`` (``Stream.targets``, from a store that ``scatters``): the pages are read
    straight into their rows and verified there, on the reading thread: the same verdicts, no
    staging at all, no verify thread and no ``land``; a bad page has written its row (the
    caller's slots, private to the load), a missing one has not."""
    import os

    allowed = os.sched_getaffinity(0)
    if cores == "one":
        os.sched_setaffinity(0, {min(allowed)})  # NOTE: this thread; the engine's inherit it
    try:
        _stream_and_check(chunk_pages, cores == "one" or len(allowed) == 1, monkeypatch,
                          direct=path == "direct")
    finally:
        os.sched_setaffinity(0, allowed)


def _stream_and_check(chunk_pages: int, one_core: bool, monkeypatch: pytest.MonkeyPatch, *,
                      direct: bool) -> None:
    from radixlink.pages import stream as stream_module
    from radixlink.pages.engine import TransferStatus

    store, arena = MemoryStore(1 << 20), _CountingArena()
    codecs, keys, data = _two_pools(store, arena)
    stride = frame_stride(codecs[0].frame_bytes)
    monkeypatch.setattr(stream_module, "CHUNK_BYTES", chunk_pages * stride)
    monkeypatch.setattr(stream_module, "DIRECT_READ_BYTES", 0)  # NOTE: chunks, direct too
    copied: list[object] = []
    land = (lambda *args: copied.append(args)) if direct else None
    arena.most = 0  # NOTE: the saves above used staging; the load is counted from here
    done, rows, landed, threaded = _streamed(store, codecs, keys, arena, land, direct)
    assert done.ok and done.read is not None and done.read.reasons == [None] * 9
    assert all(torch.equal(r, d) for r, d in zip(rows, data))
    pages = sorted((pool, first + i) for pool, first, count in landed for i in range(count))
    assert pages == [(0, i) for i in range(6)] + [(1, i) for i in range(3)]
    assert arena.out == 0 and not copied
    if direct:
        assert arena.most == 0  # NOTE: headers and tags only, in a small read of their own
    else:
        assert arena.most <= (1 if one_core else stream_module.STREAM_WINDOW + 1)
    assert threaded == (not one_core and chunk_pages < 100 and not direct)
    if chunk_pages < 100:
        assert len(landed) > stream_module.STREAM_WINDOW + 1  # the bound was exercised
    _damage(store, keys[0])
    done, rows, _, _ = _streamed(store, codecs, keys, arena, land, direct)
    assert done.status is TransferStatus.MISSING and done.read is not None
    assert done.read.reasons == [None, "checksum", None, None, "truncated", "missing",
                                 None, None, None]
    assert store.exists(keys[0]) == [True, False, True, True, False, False]
    assert all(torch.equal(rows[0][i], data[0][i]) for i in (0, 2, 3))
    unwritten = (5,) if direct else (1, 4, 5)
    assert all(not rows[0][i].any() for i in unwritten)  # NOTE: random pages are never zero
    assert arena.out == 0 and not copied


@pytest.mark.parametrize("fits", [True, False], ids=["one pass", "over the bound"])
def test_a_direct_stream_over_many_chunks_is_read_in_one_pass(
        fits: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream read straight into its targets has no staging for chunks to bound: up to
    ``DIRECT_READ_BYTES`` of payload it is one ``get_scattered`` of every page (each chunk
    boundary cost the reads around it), the same verdicts and bytes; over it, one call a
    chunk as before."""
    from radixlink.pages import stream as stream_module

    store, arena = _CountingScatters(1 << 20), _CountingArena()
    codecs, keys, data = _two_pools(store, arena)
    monkeypatch.setattr(stream_module, "CHUNK_BYTES", frame_stride(codecs[0].frame_bytes))
    monkeypatch.setattr(stream_module, "DIRECT_READ_BYTES", 9 * PAGE if fits else 9 * PAGE - 1)
    done, rows, landed, threaded = _streamed(store, codecs, keys, arena, direct=True)
    assert done.ok and done.read is not None and done.read.reasons == [None] * 9
    assert all(torch.equal(r, d) for r, d in zip(rows, data)) and not threaded
    assert store.scattered == (1 if fits else 9)
    assert landed == ([(0, 0, 6), (1, 0, 3)] if fits else
                      [(0, i, 1) for i in range(6)] + [(1, i, 1) for i in range(3)])


class _CountingScatters(MemoryStore):
    """A memory store that counts ``get_scattered`` calls."""

    scattered = 0

    def get_scattered(self, keys, targets, each=None, part=None):  # type: ignore[no-untyped-def]
        self.scattered += 1
        return super().get_scattered(keys, targets, each, part)


@pytest.mark.parametrize("failure", ["store", "land", "direct read", "direct in one pass"])
def test_a_streamed_load_that_fails_gives_every_chunks_staging_back(
        failure: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store error on the third chunk (through staging, or read straight into the
    targets), or in a direct read of one pass, or a landing that raises on the second
    chunk, ends the streamed load as STORE_ERROR with the error in its detail, nothing
    raised, and every chunk's staging back in the arena."""
    from radixlink.pages import stream as stream_module
    from radixlink.pages.engine import TransferStatus

    fail_at = {"land": 0, "direct in one pass": 1}.get(failure, 3)
    store, arena = _FailingRead(fail_at), _CountingArena()
    codec = pageio.make_codec("fp", PAGE)
    keys = PageKeys().keys(PoolName.KV, HASHES, "ab")
    assert _save(store, codec, keys, _pages(6, seed=1), arena).ok
    monkeypatch.setattr(stream_module, "CHUNK_BYTES", 1)
    if failure == "direct read":
        monkeypatch.setattr(stream_module, "DIRECT_READ_BYTES", 0)  # NOTE: chunks
    calls = []

    def land(spans, piece, read) -> None:  # type: ignore[no-untyped-def]
        calls.append(spans)
        if failure == "land" and len(calls) == 2:
            raise RuntimeError("a landing bug")

    done, _, _, _ = _streamed(store, [codec], [keys], arena,
                              land=land if failure == "land" else None,
                              direct=failure.startswith("direct"))
    assert done.status is TransferStatus.STORE_ERROR
    assert ("landing bug" if failure == "land" else "went away") in done.detail
    assert arena.out == 0 and arena.most <= stream_module.STREAM_WINDOW + 1


def test_every_chunk_of_a_streamed_load_reuses_the_reserved_staging(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``reserve_stream`` faults in the staging of a full chunk; a load of 5 pages in chunks
    of 2 then allocates nothing, its short last chunk included (a buffer of half the size
    would be a new allocation, faulted in on the load's path)."""
    from radixlink.pages import stream as stream_module
    from radixlink.pages.engine import Job, TransferEngine, TransferKind
    from radixlink.pages.stream import Stream

    page = 256 << 10
    store, arena = MemoryStore(16 << 20), StagingArena()
    codec = pageio.make_codec("fp", page)
    keys = PageKeys().keys(PoolName.KV, HASHES[:5], "ab")
    gen = torch.Generator().manual_seed(3)
    data = torch.randint(0, 256, (5, page), dtype=torch.uint8, generator=gen)
    assert _save(store, codec, keys, data, arena).ok
    monkeypatch.setattr(stream_module, "CHUNK_BYTES", 2 * frame_stride(codec.frame_bytes))
    engine = TransferEngine(store, 2, arena)
    try:
        engine.reserve_stream([codec])
        reserved = arena.stats()["staging_allocs"]
        rows = torch.zeros(5, page, dtype=torch.uint8)

        def land(spans, piece, read) -> None:  # type: ignore[no-untyped-def]
            for (_, first, count), part in zip(spans, piece, strict=True):
                rows[first : first + count] = part.frames.payloads()

        done = engine.run(Job(kind=TransferKind.LOAD, parts=(),
                              stream=Stream([(codec, keys)], land)))
        assert done.ok and torch.equal(rows, data)
        assert arena.stats()["staging_allocs"] == reserved
    finally:
        engine.close()
