"""The directory store's layout upgrade (``dirlayout.ShardLayout.upgrade``: the two-level
``<aa>/<b>/`` leaves moved to ``<aab>/``) racing live writers and readers in other processes,
and other processes upgrading at the same time (issue 44): no page is lost, none is replaced
by an older copy, and no reader ever sees a page that is not its key's, whole and current.

Real processes on a real directory (tests/stores/upgrade_race_child.py; forked, because a fresh
interpreter spends seconds importing torch through radixlink.contract), all of this version:
two writers putting new versions of their keys without pause, two readers checking every page
they read, and three upgraders that open the store at the same moment, three rounds. Each round
first drops leaves of the old layout into the root, as a process of an earlier version would
have left them: version 0 of a third of the keys, some in shards whose new leaf the writers
already use (the upgrade then moves pages one by one), some in shards with no new leaf yet
(one rename of the leaf).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from radixlink.stores.directory import DirectoryStore

from . import upgrade_race_child as child

NUM_KEYS = 2400
ROUNDS = 3
UPGRADERS = 3
# NOTE: fork, not spawn: the children use only the store and the codec (no torch op, no
# thread of ours), and a spawned one would import torch again (seconds each, 7 children)
CONTEXT = multiprocessing.get_context("fork")


class Child:
    """One process running ``target(connection, *args)``, and our end of its connection."""

    def __init__(self, target: Callable[..., None], *args: Any):
        self.conn, theirs = CONTEXT.Pipe()
        self.proc = CONTEXT.Process(target=target, args=(theirs, *args), daemon=True)
        self.proc.start()
        theirs.close()

    def recv(self, timeout_s: float = 60.0) -> Any:
        assert self.conn.poll(timeout_s), f"{self.proc.name} said nothing in {timeout_s}s"
        return self.conn.recv()

    def kill(self) -> None:
        if self.proc.is_alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(timeout=30)


def _inject_old_leaves(tmp: Path, root: Path, round_: int) -> tuple[int, int]:
    """Write version 0 of keys ``idx % ROUNDS == round_`` in the two-level layout into
    ``root`` (built aside, then one rename per leaf). Returns how many old leaves went in and
    how many of them have a new leaf in ``root`` already."""
    stage = tmp / f"stage{round_}"
    old = DirectoryStore(stage)
    idxs = [idx for idx in range(NUM_KEYS) if idx % ROUNDS == round_]
    assert all(old.put({child.key(idx): child.page(idx, 0) for idx in idxs}))
    old.close()
    leaves = [p for p in stage.iterdir() if p.is_dir() and len(p.name) == 3]
    beside_new = 0
    for leaf in leaves:
        beside_new += (root / leaf.name).is_dir()
        (root / leaf.name[:2]).mkdir(exist_ok=True)
        leaf.rename(root / leaf.name[:2] / leaf.name[2])  # fails if an old leaf is still here
    return len(leaves), beside_new


def test_upgrade_racing_writers_readers_and_other_upgraders(tmp_path: Path) -> None:
    """Flow: writers and readers run on a store of the one-level layout; three times, old
    leaves appear and three upgraders open the store at once while the writers and readers go
    on. Then: every key holds its newest version (a writer's last stored one, else the old
    layout's version 0): none lost, none replaced by the older copy; no old leaf or temp file
    is left; every page any reader read was its key's, whole, and never older than one it had
    read before; the readers did read old pages once they were moved."""
    root, stop = tmp_path / "store", tmp_path / "stop"
    DirectoryStore(root).close()
    procs: list[Child] = []
    try:
        writers = [Child(child.writer, str(root), str(stop), w, NUM_KEYS) for w in (0, 1)]
        readers = [Child(child.reader, str(root), str(stop), seed, NUM_KEYS) for seed in (1, 2)]
        upgraders = [Child(child.upgrader, str(root)) for _ in range(UPGRADERS)]
        procs = writers + readers + upgraders
        assert all(proc.recv() == "ready" for proc in procs)
        both_paths = [0, 0]  # old leaves moved by one rename / beside an existing new leaf
        for round_ in range(ROUNDS):
            num_old, beside_new = _inject_old_leaves(tmp_path, root, round_)
            both_paths[0] += num_old - beside_new
            both_paths[1] += beside_new
            for proc in upgraders:  # NOTE: back to back, so the three opens overlap
                proc.conn.send("open")
            opened = [proc.recv() for proc in upgraders]
            assert min(o["left"] for o in opened) == 0, opened  # the last one leaves nothing
            inspect = DirectoryStore(root, read_only=True)
            assert inspect.stats()["old_layout_leaves"] == 0
            inspect.close()
        assert min(both_paths) > 0, both_paths  # both ways of moving a leaf were raced
        stop.touch()
        last: dict[int, int] = {}
        for proc in writers:
            reply = proc.recv()
            assert "error" not in reply, reply
            last.update(reply)
        seen = [proc.recv() for proc in readers]
        for proc in upgraders:
            proc.conn.send("quit")
        for proc in procs:
            proc.proc.join(timeout=60)
            assert proc.proc.exitcode == 0, proc.proc
    finally:
        for proc in procs:
            proc.kill()

    for report in seen:
        assert report["errors"] == [], report["errors"]
        assert report["hits"] > 1000 and report["old_copies_read"] > 0, report
    store = DirectoryStore(root)
    assert store.stats()["old_layout_leaves"] == 0 and store.stats()["pages"] == NUM_KEYS
    blobs = store.get([child.key(idx) for idx in range(NUM_KEYS)])
    found = {idx: child.version_of(idx, blob) if blob is not None else "lost"
             for idx, blob in enumerate(blobs)}
    want = {idx: last.get(idx, 0) for idx in range(NUM_KEYS)}
    assert len(last) == NUM_KEYS // 2  # the writers' keys (idx % 4 in 0, 1), each stored
    wrong = {idx: (found[idx], want[idx]) for idx in range(NUM_KEYS) if found[idx] != want[idx]}
    assert not wrong, f"{len(wrong)} keys not at their newest version: {list(wrong.items())[:8]}"
    assert sorted({p.name for p in root.iterdir()} - {f"{s:03x}" for s in range(4096)}) == []
    assert not [p for p in root.rglob(".*.tmp")]
    store.close()
