"""The conformance suite against ``file://`` (a fresh directory per test), and its fast read
path's rules."""

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from radixlink.stores import dirlayout, open_store
from radixlink.stores.directory import DirectoryStore

from .conformance import Backend, BackendContract, closing, codec, key, payload


class TestDirectoryStore(BackendContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[Backend]:
        url = f"file://{tmp_path}/store?capacity="
        yield from closing(
            Backend(lambda cap: open_store(url + str(cap or 1 << 30)), persistent=True)
        )


def _buffers(n: int, size: int) -> list[memoryview]:
    arena = memoryview(bytearray(n * size))
    return [arena[i * size : (i + 1) * size] for i in range(n)]


def test_a_get_into_batch_counts_as_a_use(tmp_path: Path) -> None:
    """A batch read of known pages (the fast path: every page at its indexed size) moves them
    to most recently used and counts its hits: the next eviction takes other pages."""
    c = codec()
    blobs = {key(i): c.encode(payload(i), key(i)) for i in range(12)}
    size = len(blobs[key(0)])
    store = open_store(f"file://{tmp_path}/store?capacity={10 * size}")
    store.put({key(i): blobs[key(i)] for i in range(8)})
    assert store.get_into([key(0), key(1)], _buffers(2, size)) == [size, size]
    assert store.stats()["hits"] == 2
    store.put({key(i): blobs[key(i)] for i in range(8, 12)})
    assert store.exists([key(i) for i in range(12)]) == [True, True, False, False] + [True] * 8


def test_remembered_page_files_keep_every_read_rule(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Page files remembered by key (written, looked up or read before) are read with the same
    rules: a page replaced by a symlink to an old file outside is refused and its target left
    untouched; past the memo's bound every page still reads back whole."""
    monkeypatch.setattr(dirlayout, "PATH_MEMO", 4)
    store = open_store(f"file://{tmp_path}/store")
    store.put({key(i): payload(i, 100) for i in range(10)})
    assert store.exists([key(i) for i in range(10)]) == [True] * 10
    buffers = _buffers(10, 100)
    assert store.get_into([key(i) for i in range(10)], buffers) == [100] * 10
    assert all(bytes(buffers[i]) == payload(i, 100) for i in range(10))
    assert len(store._layout._paths) <= 4 + 10
    target = tmp_path / "outside"
    target.write_bytes(b"x" * 100)
    os.utime(target, (1_000_000, 1_000_000))
    page = Path(store.path_of(key(9)))
    page.unlink()
    page.symlink_to(target)
    assert store.get_into([key(9)], buffers[:1]) == [None]
    assert store.stats()["refused"] == 1 and target.stat().st_mtime == 1_000_000


def test_get_scattered_closes_every_file_when_each_raises(tmp_path: Path) -> None:
    """``each`` runs once a page's file is closed: one that raises on the second page leaves
    no file open, and the store reads on."""
    store = DirectoryStore(tmp_path / "store")
    store.put({key(i): bytes([i]) * 500 for i in range(3)})
    keys = [key(i) for i in range(3)]
    open_fds = len(os.listdir("/proc/self/fd"))

    def each(i: int, size: int | None) -> None:
        assert len(os.listdir("/proc/self/fd")) == open_fds  # page i's file is closed
        if i == 1:
            raise RuntimeError("a check bug")

    with pytest.raises(RuntimeError, match="a check bug"):
        store.get_scattered(keys, [[memoryview(bytearray(500))] for _ in keys], each)
    assert len(os.listdir("/proc/self/fd")) == open_fds
    assert store.get(keys[2:]) == [bytes([2]) * 500]
    store.close()


def test_get_scattered_reads_a_page_in_runs_when_asked_for_parts(tmp_path: Path) -> None:
    """With ``part`` a page file is read in runs of about ``PART_BYTES``: ``part(i, n)`` comes
    when pieces 0..n-1 hold their bytes and the rest are not yet read, n growing, all before
    ``each(i, ...)``; a file shorter than its pieces stops the calls at its short run."""
    from radixlink.stores.pagefiles import PART_BYTES

    store = DirectoryStore(tmp_path / "store")
    piece = 10 * 1024
    value = random.Random(4).randbytes(60 * piece)
    store.put({key(0): value, key(1): value[: 30 * piece + 5]})
    arena = memoryview(bytearray(2 * 60 * piece))
    targets = [[arena[(k * 60 + j) * piece : (k * 60 + j + 1) * piece] for j in range(60)]
               for k in range(2)]
    calls: list[tuple[str, int, int]] = []

    def part(i: int, n: int) -> None:
        start = i * 60 * piece
        assert bytes(arena[start : start + n * piece]) == value[: n * piece]
        assert bytes(arena[start + n * piece : start + 60 * piece]) == bytes((60 - n) * piece)
        calls.append(("part", i, n))

    def each(i: int, size: int | None) -> None:
        calls.append(("each", i, size or 0))

    assert store.get_scattered([key(0), key(1)], targets, each, part=part) == [
        60 * piece, 30 * piece + 5]
    per_run = -(-PART_BYTES // piece)  # pieces a run holds: the first that reaches PART_BYTES
    whole = [("part", 0, n) for n in range(per_run, 60, per_run)] + [("part", 0, 60)]
    short = [("part", 1, n) for n in range(per_run, 30, per_run)]
    assert calls == [*whole, ("each", 0, 60 * piece), *short, ("each", 1, 30 * piece + 5)]
    assert bytes(arena[60 * piece : 90 * piece + 5]) == value[: 30 * piece + 5]
    store.close()


def test_the_compiled_loop_reads_as_get_scattered_and_checksums_each_payload(
        tmp_path: Path, page_loop: str) -> None:
    """``get_scattered_xxh3`` through the compiled loop: the same sizes and bytes as
    ``get_scattered`` (pages over more pieces than one ``readv`` takes, and in runs: 2,500
    pieces of 1 byte, 60 of 10 KiB; a short file, a missing one), and each page's digest the
    xxh3 of its pieces but the first and the last, None where it was not read whole; in
    Python alone there is no such read (None)."""
    import xxhash

    store = DirectoryStore(tmp_path / "store")
    small, big = random.Random(3).randbytes(3000), random.Random(5).randbytes(600 * 1024)
    store.put({key(0): small, key(1): small[:1500], key(2): big})
    shapes = [[1] * 2500, [1] * 2500, [10 * 1024] * 60, [100]]  # the last page is missing
    keys = [key(i) for i in range(4)]

    def targets() -> tuple[memoryview, list[list[memoryview]]]:
        arena = memoryview(bytearray(sum(map(sum, shapes))))
        out, at = [], 0
        for shape in shapes:
            out.append([arena[at + sum(shape[:j]) : at + sum(shape[: j + 1])]
                        for j in range(len(shape))])
            at += sum(shape)
        return arena, out

    plain_arena, plain = targets()
    sizes = store.get_scattered(keys, plain)
    arena, compiled = targets()
    read = store.get_scattered_xxh3(keys, compiled)
    if page_loop == "python":
        assert read is None
        return
    assert read is not None
    assert read[0] == sizes == [3000, 1500, 600 * 1024, None]
    assert bytes(arena) == bytes(plain_arena)
    assert read[1] == [xxhash.xxh3_64_intdigest(small[1:2499]), None,
                       xxhash.xxh3_64_intdigest(big[10 * 1024 : -10 * 1024]), None]
    assert store.stats()["hits"] == 6 and store.stats()["misses"] == 2
    with pytest.raises(ValueError, match="2 keys but 1 piece lists"):
        store.get_scattered_xxh3(keys[:2], compiled[:1])
    store.close()


def test_the_compiled_page_loop_is_built_where_a_compiler_is() -> None:
    """The optional extension builds wherever ``pip install`` found a C compiler: a build
    that broke would otherwise leave every load on the Python loop, silently."""
    import shutil
    import sysconfig

    from radixlink.stores import pagefiles

    if shutil.which(sysconfig.get_config_var("CC").split()[0] or "cc") is None:
        pytest.skip("no C compiler here: the directory store reads in Python")
    assert pagefiles.COMPILED is not None, (
        "radixlink/stores/_pagefiles.c did not build or bind: pip install -e . shows why")


def test_get_scattered_over_more_pieces_than_one_readv_takes(tmp_path: Path) -> None:
    """A page read into more pieces than one ``readv`` takes (``IOV_MAX``, 1024 on Linux) is
    read whole, in order; a file shorter than its pieces fills the first of them."""
    store = DirectoryStore(tmp_path / "store")
    value = random.Random(3).randbytes(3000)
    store.put({key(0): value, key(1): value[:1500]})
    arena = memoryview(bytearray(2 * 2500))
    targets = [[arena[i : i + 1] for i in range(2500 * k, 2500 * (k + 1))] for k in range(2)]
    assert store.get_scattered([key(0), key(1)], targets) == [3000, 1500]
    assert bytes(arena[:2500]) == value[:2500]
    assert bytes(arena[2500:4000]) == value[:1500] and bytes(arena[4000:]) == bytes(1000)
    with pytest.raises(ValueError, match="2 keys but 1 piece lists"):
        store.get_scattered([key(0), key(1)], targets[:1])
    store.close()
