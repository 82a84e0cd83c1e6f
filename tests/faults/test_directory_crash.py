"""Fault matrix, directory store: a writer process SIGKILLed in the middle of an offload (then a
linker loads from what it left), pages torn on disk, and a read-only store directory."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sandbox import read_only_command

from radixlink.stores.directory import DirectoryStore

from .kit import MODEL_NS, PS, TOKENS, assert_exact, child_env, kill, make_cache, offload, request

SLOW_OFFLOADER = textwrap.dedent("""
    import os, sys, time
    import faults.kit as kit
    from radixlink.linker.core import ExternalCacheLinker
    from radixlink.stores.directory import DirectoryStore

    real_write = os.write
    def slow_write(fd, data):  # a slow disk: 256 bytes per call, 10 ms apart
        time.sleep(0.01)
        return real_write(fd, data[:256])
    os.write = slow_write
    cache = kit.make_cache(namespace=kit.MODEL_NS)
    linker = ExternalCacheLinker(cache, DirectoryStore(sys.argv[1]))
    print("serving", flush=True)
    kit.serve(cache, kit.TOKENS)  # write_through: the offload runs on the linker's thread
    time.sleep(120)
""")


def _pages(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")]


def _temps(root: Path) -> list[Path]:
    return list(root.rglob(".*.tmp"))


def test_writer_killed_mid_offload_then_a_linker_loads_what_it_left(tmp_path, link) -> None:
    """Flow: a child process offloads 10 pages to a directory store through a slow disk and
    is SIGKILLed with some pages written and one half written. Reopening removes the dead
    writer's temp file; a linker restores exactly the complete leading pages, byte-identical;
    a page torn on disk afterwards (power loss) is caught by the codec and costs a recompute."""
    child = subprocess.Popen([sys.executable, "-c", SLOW_OFFLOADER, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "serving"
        deadline = time.monotonic() + 60
        while not (len(_pages(tmp_path)) >= 3
                   and any(t.stat().st_size > 0 for t in _temps(tmp_path))):
            assert time.monotonic() < deadline and child.poll() is None, "writer never got going"
            time.sleep(0.002)
    finally:
        kill(child)
    assert _temps(tmp_path), "the killed writer should have left a half-written temp file"
    num_complete = len(_pages(tmp_path))
    assert 3 <= num_complete < 10
    store = DirectoryStore(tmp_path)
    assert _temps(tmp_path) == []
    cache_b = make_cache(namespace=MODEL_NS)
    linker_b = link(cache_b, store)
    result = request(cache_b, linker_b, TOKENS, "b")  # checks the served K/V
    assert result["hit"] == num_complete * PS and result["ok"], result
    assert result["prefix"] == num_complete * PS
    assert linker_b.flush(timeout=30)  # B wrote the pages it computed: all 10 are there now
    assert_exact(cache_b)

    victim = sorted(_pages(tmp_path), key=lambda p: p.stat().st_mtime)[1]  # page 1 of 10
    victim.write_bytes(victim.read_bytes()[:300])
    cache_c = make_cache(namespace=MODEL_NS)
    linker_c = link(cache_c, DirectoryStore(tmp_path))
    result = request(cache_c, linker_c, TOKENS, "c")
    assert result["ok"] is False and result["prefix"] == 0, result
    assert linker_c.stats()["codec_misses"]["truncated"] == 1
    assert linker_c.flush(timeout=30)
    assert_exact(cache_c)


READ_ONLY_CHILD = textwrap.dedent("""
    import json, sys
    import faults.kit as kit
    from radixlink.linker.core import ExternalCacheLinker
    from radixlink.stores.directory import DirectoryStore

    store = DirectoryStore(sys.argv[1])
    cache = kit.make_cache(namespace=kit.MODEL_NS)
    linker = ExternalCacheLinker(cache, store)
    loaded = kit.request(cache, linker, kit.TOKENS, "r1")
    fresh = kit.request(cache, linker, list(range(500, 540)), "r2")
    assert linker.flush(timeout=30)
    kit.assert_exact(cache)
    linker.close()
    kit.assert_exact(cache)
    print(json.dumps({"loaded": loaded, "fresh": fresh, "linker": linker.stats(),
                      "store": store.stats()}))
""")


def test_read_only_store_directory_serves_loads_and_refuses_offloads(tmp_path, link) -> None:
    """A store directory mounted read-only: a linker still loads what is there (verified), its
    own offloads fail cleanly (counted, EROFS/EACCES), and nothing raises into the engine."""
    root = tmp_path / "store"
    cache_a = make_cache(namespace=MODEL_NS)
    offload(cache_a, link(cache_a, DirectoryStore(root)))
    cmd = read_only_command(root, [sys.executable, "-c", READ_ONLY_CHILD, str(root)])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=child_env())
    finally:
        for path in [root, *root.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
    if proc.returncode != 0 and "mount" in proc.stderr:
        pytest.skip(f"cannot create a read-only bind mount here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["loaded"]["ok"] and out["loaded"]["prefix"] == 40, out["loaded"]
    assert out["fresh"]["hit"] == 0 and out["linker"]["failures_offload"] == 1, out["linker"]
    assert set(out["store"]["put_errors"]) <= {"EROFS", "EACCES", "EPERM"}
    assert out["store"]["put_failures"] == 10 and _temps(root) == []
