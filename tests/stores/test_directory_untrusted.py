"""The directory store treats its files as untrusted input: a huge file under a page name is
never read, a FIFO never blocks, symlinks are never followed (nor their targets touched), a
directory under a page name is counted, not raised, a full disk evicts and retries, and a
free-space floor is kept (issue 14, item 6; issue 44)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

import radixlink.stores
from radixlink.stores import pagefiles
from radixlink.stores.directory import DirectoryStore

from .conformance import key

REPO_ROOT = str(Path(radixlink.stores.__file__).resolve().parents[2])


def _page_path(store: DirectoryStore, i: int) -> Path:
    """The path of page ``i``'s file, its shard directories created (by a real put)."""
    assert store.put({key(i): b"placeholder"}) == [True]
    path = Path(store.path_of(key(i)))
    path.unlink()
    return path


def test_a_huge_file_under_a_page_name_is_never_read(tmp_path: Path) -> None:
    """A 1 GiB (sparse) file under a page name: get refuses it from fstat alone (a counted
    miss, no 1 GiB read), exists reports no page, and its neighbours still read."""
    store = DirectoryStore(tmp_path)
    huge = _page_path(store, 1)
    with open(huge, "wb") as f:
        f.truncate(1 << 30)
    store.put({key(2): b"neighbour"})
    tracemalloc.start()
    started = time.monotonic()
    try:
        assert store.get([key(1), key(2)]) == [None, b"neighbour"]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20 and time.monotonic() - started < 1.0, peak
    assert store.exists([key(1), key(2)]) == [False, True]
    assert store.stats()["refused"] == 1


def test_a_fifo_under_a_page_name_never_blocks(tmp_path: Path) -> None:
    """A FIFO under a page name (nobody writing to it): get returns a miss at once instead of
    waiting for a writer, exists says no page, close returns."""
    store = DirectoryStore(tmp_path)
    fifo = _page_path(store, 1)
    os.mkfifo(fifo)
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.append(store.get([key(1)])), daemon=True)
    reader.start()
    reader.join(timeout=5)
    try:
        assert not reader.is_alive(), "get blocked on a FIFO"
    finally:
        if reader.is_alive():  # release the blocked open (old code) so the test can end
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            reader.join(timeout=5)
    assert got == [[None]] and store.exists([key(1)]) == [False]
    assert store.stats()["refused"] == 1
    store.close()


def test_symlinks_are_never_followed_nor_their_targets_touched(tmp_path: Path) -> None:
    """A symlink under a page name to a file outside the store (old enough for an LRU touch):
    get misses, exists says no page, the target's mtime is unchanged; the rescan on open does
    not index the link, and delete removes the link, never the target."""
    store = DirectoryStore(tmp_path / "store")
    outside = tmp_path / "outside-file"
    outside.write_bytes(b"a file root may own, outside the store")
    os.utime(outside, (1_000_000, 1_000_000))
    link = _page_path(store, 1)
    link.symlink_to(outside)
    assert store.get([key(1)]) == [None] and store.exists([key(1)]) == [False]
    assert outside.stat().st_mtime == 1_000_000
    reopened = DirectoryStore(tmp_path / "store")  # the rescan does not index links
    assert reopened.stats()["pages"] == 0 and list(reopened.scan()) == []
    reopened.delete([key(1)])
    assert outside.exists() and not os.path.lexists(link)


def test_a_symlinked_shard_directory_is_neither_read_nor_written(tmp_path: Path) -> None:
    """A shard directory replaced by a link to a directory outside the store: reads through
    it miss, writes into it fail (counted), and nothing is created outside."""
    store = DirectoryStore(tmp_path / "store")
    leaf = _page_path(store, 1).parent
    outside = tmp_path / "outside"
    outside.mkdir()
    outside_page = outside / Path(store.path_of(key(1))).name
    outside_page.write_bytes(b"not the store's")
    shutil.rmtree(leaf)
    leaf.symlink_to(outside)
    fresh = DirectoryStore(tmp_path / "store")
    assert fresh.get([key(1)]) == [None] and fresh.exists([key(1)]) == [False]
    assert fresh.put({key(1): b"new"}) == [False]
    assert fresh.stats()["put_errors"] == {"ELOOP": 1}
    assert sorted(p.name for p in outside.iterdir()) == [outside_page.name]


def test_a_directory_under_a_page_name_is_counted_not_raised(tmp_path: Path) -> None:
    """Another writer of the directory (issue 44: a tenant without our secret) puts a directory
    where our page was. It cannot be unlinked (EISDIR): eviction and delete count it and go
    on, so a put still reports the page it stored and a delete still deletes its other keys;
    a put to that name is a counted False; the name reads as no page. Both used to raise
    StoreError (as for a root that vanished), the put after storing its page and the delete
    before reaching its next key."""
    store = DirectoryStore(tmp_path, capacity_bytes=3000)
    assert store.put({key(i): bytes([i]) * 1000 for i in range(3)}) == [True] * 3
    for i in (0, 1):
        page = Path(store.path_of(key(i)))
        page.unlink()
        page.mkdir()  # NOTE: the attacker's; a real directory, not a page
    assert store.put({key(3): b"d" * 1000}) == [True]  # evicts page 0: the directory
    assert store.get([key(3)]) == [b"d" * 1000]
    assert store.delete([key(1), key(2)]) == 1  # page 2 goes, page 1's name stays a directory
    assert store.exists([key(i) for i in range(4)]) == [False, False, False, True]
    assert store.put({key(1): b"x" * 1000}) == [False]
    stats = store.stats()
    assert stats["unlink_errors"] == {"EISDIR": 2} and stats["put_errors"] == {"EISDIR": 1}
    assert Path(store.path_of(key(0))).is_dir() and Path(store.path_of(key(1))).is_dir()


@pytest.mark.parametrize("read", ["get_into", "get_scattered", "get_scattered_xxh3"])
def test_get_into_applies_every_rule_within_one_batch(tmp_path: Path, read: str) -> None:
    """The read paths loads take (``get_into``; ``get_scattered``, each buffer in three
    pieces: SGLang's linker into its pools; the compiled loop), on one batch mixing every kind of
    untrusted file with good pages: a huge file, a FIFO, a symlink to an old file outside, a
    directory and a page behind a symlinked shard directory are counted refusals, read
    nothing and touch nothing; a missing page is a plain miss; the good pages around them
    land in their buffers, and an old good page has its mtime refreshed (LRU order)."""
    store = DirectoryStore(tmp_path / "store")
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "file"
    target.write_bytes(b"x" * 64)
    os.utime(target, (1_000_000, 1_000_000))
    with open(_page_path(store, 1), "wb") as f:
        f.truncate(1 << 30)
    os.mkfifo(_page_path(store, 2))
    _page_path(store, 3).symlink_to(target)
    _page_path(store, 4).mkdir()
    linked = next(i for i in range(100, 10_000)
                  if Path(store.path_of(key(i))).parent != Path(store.path_of(key(0))).parent)
    leaf = _page_path(store, linked).parent
    shutil.rmtree(leaf)
    leaf.symlink_to(outside)
    (outside / Path(store.path_of(key(linked))).name).write_bytes(b"not the store's")
    assert store.put({key(0): b"page zero", key(5): b"page five"}) == [True, True]
    os.utime(store.path_of(key(5)), (1_000_000, 1_000_000))

    fresh = DirectoryStore(tmp_path / "store")  # knows none of the leaves yet
    wanted = [0, 1, 2, 3, 4, linked, 6, 5]
    arena = memoryview(bytearray(64 * len(wanted)))
    buffers = [arena[64 * i : 64 * (i + 1)] for i in range(len(wanted))]
    started = time.monotonic()
    if read == "get_scattered_xxh3":
        if pagefiles.COMPILED is None:
            pytest.skip("the compiled page loop is not built here")
        sizes = fresh.get_scattered_xxh3([key(i) for i in wanted],
                                         [[b[:3], b[3:10], b[10:]] for b in buffers])[0]
    elif read == "get_scattered":
        sizes = fresh.get_scattered([key(i) for i in wanted],
                                    [[b[:3], b[3:10], b[10:]] for b in buffers])
    else:
        sizes = fresh.get_into([key(i) for i in wanted], buffers)
    assert time.monotonic() - started < 1.0  # nothing huge read, no FIFO waited on
    assert sizes == [9, None, None, None, None, None, None, 9]
    assert bytes(buffers[0][:9]) == b"page zero" and bytes(buffers[7][:9]) == b"page five"
    assert all(bytes(b) == bytes(64) for b in buffers[1:7])
    stats = fresh.stats()
    assert stats["refused"] == 5 and stats["read_errors"] == 0, stats
    assert stats["hits"] == 2 and stats["misses"] == 6, stats
    assert target.stat().st_mtime == 1_000_000
    assert os.stat(fresh.path_of(key(5))).st_mtime > 1_000_000
    fresh.close()


FULL_DISK = """
    import json, os, sys
    from radixlink.stores.directory import DirectoryStore

    root, min_free = sys.argv[1], sys.argv[2]
    store = DirectoryStore(root + "/store", min_free=min_free)
    results, lowest_free = [], 1 << 40
    for i in range(40):  # 40 x 64 KiB into a 1 MiB filesystem
        results += store.put({f"v2/ns/{i:064x}/kv": bytes([i]) * (64 << 10)})
        fs = os.statvfs(root)
        lowest_free = min(lowest_free, fs.f_bavail * fs.f_frsize)
    present = store.exists([f"v2/ns/{i:064x}/kv" for i in range(40)])
    print(json.dumps({"results": results, "present": present, "lowest_free": lowest_free,
                      "stats": store.stats()}))
"""


def _on_small_tmpfs(tmp_path: Path, min_free: str) -> dict:
    """Run FULL_DISK in a private mount namespace on a fresh 1 MiB tmpfs (root needed)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to mount a small tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = textwrap.dedent(FULL_DISK)
    cmd = ["unshare", "-m", "sh", "-c",
           f"mount -t tmpfs -o size=1m tmpfs '{mnt}' && exec '{sys.executable}' -c \"$0\" "
           f"'{mnt}' '{min_free}'", script]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": REPO_ROOT})
    if proc.returncode != 0 and "mount" in proc.stderr and "permission" in proc.stderr.lower():
        pytest.skip(f"cannot mount tmpfs here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_full_disk_evicts_the_oldest_pages_and_retries(tmp_path: Path) -> None:
    """With no free-space floor, a real ENOSPC on a 1 MiB tmpfs evicts least recently used
    pages and retries the write once: every put succeeds, the newest pages are there, the
    oldest were evicted for space."""
    out = _on_small_tmpfs(tmp_path, "0")
    assert out["results"] == [True] * 40, out["stats"]
    assert out["present"][-1] and not out["present"][0]
    assert out["stats"]["evicted_for_space"] > 0, out["stats"]


def test_the_store_keeps_a_free_space_floor(tmp_path: Path) -> None:
    """With min_free=25% the store evicts before the filesystem drops below a quarter free:
    every put succeeds and free space never fell under the floor."""
    out = _on_small_tmpfs(tmp_path, "25%")
    assert out["results"] == [True] * 40, out["stats"]
    assert out["lowest_free"] >= (1 << 20) // 4 - (8 << 10), out  # a few blocks of slack
    assert out["stats"]["put_errors"] == {}, out["stats"]


def test_read_only_open_creates_nothing_and_evicts_nothing(tmp_path: Path) -> None:
    """read_only: a missing directory is an error (not created); a smaller capacity evicts
    nothing; put stores nothing (False, counted EROFS); delete raises."""
    from radixlink.errors import StoreError

    with pytest.raises(StoreError, match="no store directory"):
        DirectoryStore(tmp_path / "typo", read_only=True)
    assert not (tmp_path / "typo").exists()
    store = DirectoryStore(tmp_path / "s")
    store.put({key(i): b"x" * 1000 for i in range(10)})
    ro = DirectoryStore(tmp_path / "s", capacity_bytes=2000, read_only=True)
    assert ro.stats()["pages"] == 10 and ro.gc() == 0
    assert ro.put({key(11): b"y"}) == [False] and ro.stats()["put_errors"] == {"EROFS": 1}
    with pytest.raises(StoreError, match="read-only"):
        ro.delete([key(1)])
    assert DirectoryStore(tmp_path / "s", capacity_bytes=1 << 30).stats()["pages"] == 10


def test_key_names_escape_and_refuse_alike_on_every_path(tmp_path: Path) -> None:
    """A key that starts with "." is stored as a "%2E" name (never a temp-like dot file) and
    reads back by get and get_into, in a batch with plain keys; a key too long for a file name
    is refused with a ValueError by put, get and get_into alike."""
    store = DirectoryStore(tmp_path)
    dotted, plain = ".hidden/page", key(7)
    assert store.put({dotted: b"dot page", plain: b"plain page"}) == [True, True]
    assert os.path.basename(store.path_of(dotted)) == "%2Ehidden%2Fpage"
    assert store.get([plain, dotted, key(8)]) == [b"plain page", b"dot page", None]
    buffers = [memoryview(bytearray(16)) for _ in range(3)]
    assert store.get_into([dotted, plain, key(8)], buffers) == [8, 10, None]
    assert bytes(buffers[0][:8]) == b"dot page" and bytes(buffers[1][:10]) == b"plain page"
    too_long = "k" * 201
    with pytest.raises(ValueError, match="too long for a file name"):
        store.put({too_long: b"x"})
    with pytest.raises(ValueError, match="too long for a file name"):
        store.get([plain, too_long])
    with pytest.raises(ValueError, match="too long for a file name"):
        store.get_into([plain, too_long], buffers[:2])
