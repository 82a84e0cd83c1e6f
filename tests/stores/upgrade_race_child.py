"""The processes of tests/stores/test_directory_upgrade_race.py: a writer, a reader or an
upgrader on one directory store, each with its own ``DirectoryStore`` handle, each talking to
the test through one ``multiprocessing`` connection (it sends "ready" first).

    writer(root, stop, w, n)     puts versions 1, 2, ... of its keys (idx % 4 == w, idx < n)
                                 until ``stop`` exists; sends {idx: last stored version}
    reader(root, stop, seed, n)  reads random batches (get, get_into, exists) until ``stop``
                                 exists; every page read must be the page of its key, no older
                                 than the last one it read there; sends counts and errors
    upgrader(root)               on each "open" it receives, opens the store writable (which
                                 moves the two-level layout's leaves); sends {left, seconds}

Pages are self-describing: ``page(idx, version)`` is a codec page whose payload starts with
``idx:version:`` and continues with bytes drawn from both, so a reader tells a wrong page, a
torn one and an older copy apart. Owns nothing of the library.
"""

from __future__ import annotations

import os
import random
import time
from multiprocessing.connection import Connection

from radixlink.contract import PoolName
from radixlink.stores import PageCodec, page_key
from radixlink.stores.directory import DirectoryStore

PAGE_BYTES = 512
CODEC = PageCodec("upgrade-race", PAGE_BYTES)


def key(idx: int) -> str:
    return page_key("race", f"{idx:064x}", PoolName.KV)


def payload(idx: int, version: int) -> bytes:
    head = f"{idx}:{version}:".encode()
    return head + random.Random(idx * 1_000_003 + version).randbytes(PAGE_BYTES - len(head))


def page(idx: int, version: int) -> bytes:
    return CODEC.encode(payload(idx, version), key(idx))


def version_of(idx: int, blob: bytes | memoryview) -> int | str:
    """The version of a page read under ``key(idx)``, or why it is not a page of that key."""
    view = CODEC.decode(blob, key(idx))
    if view is None:
        return "not a whole page of its key (codec miss)"
    data = bytes(view)
    parts = data.split(b":", 2)
    if len(parts) != 3 or parts[0] != str(idx).encode() or not parts[1].isdigit():
        return f"the payload of another page: {data[:24]!r}"
    version = int(parts[1])
    if data != payload(idx, version):
        return f"a wrong body for version {version}"
    return version


def writer(conn: Connection, root: str, stop: str, which: int, num_keys: int) -> None:
    store = DirectoryStore(root)
    mine = [idx for idx in range(num_keys) if idx % 4 == which]
    random.Random(which).shuffle(mine)
    last: dict[int, int] = {}
    version = 0
    conn.send("ready")
    while not os.path.exists(stop):
        version += 1
        for start in range(0, len(mine), 16):
            batch = mine[start : start + 16]
            ok = store.put({key(idx): page(idx, version) for idx in batch})
            for idx, stored in zip(batch, ok, strict=True):
                if stored:
                    last[idx] = version
            if not all(ok):
                conn.send({"error": f"put refused: {store.stats()['put_errors']}"})
                return
    store.close()
    conn.send(last)


def reader(conn: Connection, root: str, stop: str, seed: int, num_keys: int) -> None:
    store = DirectoryStore(root)
    rng = random.Random(seed)
    seen: dict[int, int] = {}
    counts = {"hits": 0, "misses": 0, "old_copies_read": 0, "present": 0}
    errors: list[str] = []
    buffers = [memoryview(bytearray(PAGE_BYTES + 256)) for _ in range(32)]
    conn.send("ready")
    rounds = 0
    while not os.path.exists(stop) and len(errors) < 20:
        rounds += 1
        idxs = rng.sample(range(num_keys), 32)
        keys = [key(idx) for idx in idxs]
        if rounds % 2:
            blobs: list[bytes | memoryview | None] = list(store.get(keys))
        else:
            sizes = store.get_into(keys, buffers)
            blobs = [None if n is None else buf[:n] for buf, n in zip(buffers, sizes)]
        counts["present"] += sum(store.exists(keys))
        for idx, blob in zip(idxs, blobs, strict=True):
            if blob is None:
                counts["misses"] += 1
                continue
            counts["hits"] += 1
            got = version_of(idx, blob)
            if isinstance(got, str):
                errors.append(f"key {idx}: {got}")
            elif got < seen.get(idx, 0):
                errors.append(f"key {idx}: version {got} read after version {seen[idx]}")
            else:
                counts["old_copies_read"] += got == 0
                seen[idx] = got
    store.close()
    conn.send({**counts, "errors": errors})


def upgrader(conn: Connection, root: str) -> None:
    conn.send("ready")
    while conn.recv() == "open":
        started = time.monotonic()
        store = DirectoryStore(root)
        left = store.stats()["old_layout_leaves"]
        store.close()
        conn.send({"left": left, "seconds": time.monotonic() - started})
