"""Directory store under real failures: killed writers, unwritable directories, bit rot, several
processes writing one key, capacity enforced from the index rebuilt on open."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from sandbox import read_only_command

import radixlink.stores
from radixlink.stores.directory import DirectoryStore

from .conformance import codec, key, payload

REPO_ROOT = str(Path(radixlink.stores.__file__).resolve().parents[2])


def _python(script: str, *args: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(script), *args]


def _run_child(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


def _temp_files(root: Path) -> list[Path]:
    return [path for path in root.rglob(".*.tmp")]


SLOW_WRITER = """
    import os, sys, time
    from radixlink.stores.directory import DirectoryStore

    real_write = os.write
    def slow_write(fd, data):  # a slow disk: real writes of at most 64 KiB, 20 ms apart
        time.sleep(0.02)
        return real_write(fd, data[: 1 << 16])
    os.write = slow_write
    store = DirectoryStore(sys.argv[1])
    print("writing", flush=True)
    store.put({sys.argv[2]: b"N" * (8 << 20)})
    print("done", flush=True)
"""


def test_writer_killed_mid_write_leaves_no_partial_page(tmp_path: Path) -> None:
    """Flow: a child process starts overwriting a page with 8 MiB (slowly) and is SIGKILLed
    halfway; reopening shows the old complete page, and the crash's temp file is removed."""
    store = DirectoryStore(tmp_path)
    old = codec().encode(payload(1), key(1))
    store.put({key(1): old})
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    child = subprocess.Popen(
        _python(SLOW_WRITER, str(tmp_path), key(1)), stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "writing"
        deadline = time.monotonic() + 20
        while not any(p.stat().st_size > 0 for p in _temp_files(tmp_path)):
            assert time.monotonic() < deadline and child.poll() is None, "writer never started"
            time.sleep(0.005)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    assert _temp_files(tmp_path), "the killed writer should have left its temp file"
    reopened = DirectoryStore(tmp_path)
    assert _temp_files(tmp_path) == []
    assert reopened.get([key(1)]) == [old]
    assert list(reopened.scan()) == [(key(1), len(old))]


UNWRITABLE_CHILD = """
    import json, sys
    from radixlink.stores.directory import DirectoryStore

    store = DirectoryStore(sys.argv[1])
    results = store.put({sys.argv[2]: b"x" * 100, sys.argv[3]: b"y" * 100})
    got = store.get([sys.argv[4]])[0]
    print(json.dumps({"results": results, "stats": store.stats(), "old": got.hex()}))
"""


def test_unwritable_directory_puts_fail_cleanly_and_are_counted(tmp_path: Path) -> None:
    """Every put into a read-only directory returns False and is counted; nothing raises and
    stored pages stay readable."""
    root = tmp_path / "store"
    DirectoryStore(root).put({key(0): b"old page"})
    cmd = read_only_command(root, _python(UNWRITABLE_CHILD, str(root), key(1), key(0), key(0)))
    try:
        proc = _run_child(cmd)
    finally:
        for path in [root, *root.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
    if proc.returncode != 0 and "mount" in proc.stderr:
        pytest.skip(f"cannot create a read-only bind mount here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["results"] == [False, False]
    assert out["stats"]["put_failures"] == 2
    assert set(out["stats"]["put_errors"]) <= {"EROFS", "EACCES", "EPERM"}
    assert bytes.fromhex(out["old"]) == b"old page"
    assert _temp_files(root) == []


FSIZE_CHILD = """
    import json, resource, signal, sys
    from radixlink.stores.directory import DirectoryStore

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
    store = DirectoryStore(sys.argv[1])
    results = store.put({sys.argv[2]: b"s" * 4096, sys.argv[3]: b"b" * (1 << 20)})
    print(json.dumps({"results": results, "stats": store.stats()}))
"""


def test_write_error_mid_page_is_a_counted_false_with_no_temp_left(tmp_path: Path) -> None:
    """A write failing halfway through a page (RLIMIT_FSIZE, honoured even by root) makes that
    page's put False and counted, removes its temp file, and leaves other pages stored."""
    proc = _run_child(_python(FSIZE_CHILD, str(tmp_path), key(1), key(2)))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["results"] == [True, False]
    assert out["stats"]["put_errors"] == {"EFBIG": 1}
    assert _temp_files(tmp_path) == []
    assert DirectoryStore(tmp_path).exists([key(1), key(2)]) == [True, False]


SAME_KEY_WRITER = """
    import sys, time
    from radixlink.stores.directory import DirectoryStore

    store = DirectoryStore(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        store.put({sys.argv[2]: b"\\x01" * (1 << 18)})
"""


def test_processes_writing_one_key_never_expose_a_partial_page(tmp_path: Path) -> None:
    """Flow: a child process and a thread here overwrite one key for 0.5 s with different
    values while this process reads it: every read is one whole value, and the child's
    writes are visible here without reopening; no temp file is left."""
    store = DirectoryStore(tmp_path)
    versions = {b"\x00" * (1 << 18), b"\x01" * (1 << 18)}
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    cmd = _python(SAME_KEY_WRITER, str(tmp_path), key(7))
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdin is not None and child.stdout is not None
    assert child.stdout.readline().strip() == "ready"

    def write_here() -> None:
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            store.put({key(7): b"\x00" * (1 << 18)})

    writer = threading.Thread(target=write_here)
    child.stdin.write("go\n")
    child.stdin.flush()
    writer.start()
    seen: set[bytes] = set()
    while child.poll() is None or writer.is_alive():
        value = store.get([key(7)])[0]
        assert value is None or value in versions
        seen.add(value or b"")
    writer.join()
    assert child.wait() == 0 and seen & versions
    assert store.get([key(7)])[0] in versions and _temp_files(tmp_path) == []


def test_bit_rot_on_disk_is_a_counted_miss(tmp_path: Path) -> None:
    """A byte flipped in a page file on disk is caught by the codec's checksum."""
    store, c = DirectoryStore(tmp_path), codec()
    store.put({key(3): c.encode(payload(3), key(3))})
    path = Path(store.path_of(key(3)))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x10
    path.write_bytes(bytes(data))
    assert c.decode(store.get([key(3)])[0], key(3)) is None and c.stats()["checksum"] == 1


def test_reopen_rebuilds_the_index_and_enforces_a_smaller_capacity(tmp_path: Path) -> None:
    """Reopening scans once: page count and bytes match, and a lower capacity evicts the
    least recently used pages (file mtimes carry LRU order across restarts)."""
    store = DirectoryStore(tmp_path)
    for i in range(6):
        store.put({key(i): b"p" * 1000})
        os.utime(store.path_of(key(i)), (1_000_000 + i, 1_000_000 + i))
    os.utime(store.path_of(key(0)), (2_000_000, 2_000_000))  # page 0 was read last
    assert DirectoryStore(tmp_path).stats()["pages"] == 6
    small = DirectoryStore(tmp_path, capacity_bytes=3000)
    assert (small.stats()["pages"], small.stats()["bytes"]) == (3, 3000)
    assert small.exists([key(i) for i in range(6)]) == [True, False, False, False, True, True]
