"""What loading a store's pages costs with no engine around it (``bench vllm``'s and ``bench
sglang``'s denominators): one batched ``get_into`` of every page into one buffer, a memcpy of
those bytes, and each pass a load makes timed alone on one core.

Owns these measurements; the in-engine rates are the engine benches'.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np


def raw_rates(url: str, repeat: int = 3, pieces: int = 1) -> dict[str, Any]:
    """GB/s of the best of ``repeat`` batched ``get_into`` of every page in the store into one
    buffer (what a load reads, without verify or scatter), and of a memcpy of those bytes.

    Also the passes a load makes, each timed alone on one core (vLLM's CPU worker runs on
    the cores its OMP threads are bound to: one here, with one reserved), and the bound they
    set together: the read, the check (xxh3, or the keyed BLAKE3 tag of a sealed store) of
    every page, and the copy into 4 KiB-paged memory as vLLM's KV blocks are. On one core
    they add up (``bound_GBps``); on two, the read of one chunk at best overlaps the check and
    copy of the one before (``two_core_bound_GBps``: the slower of the two sides). A load read
    straight into the pools makes no copy: its bounds are the read and the check
    (``direct_bound_GBps``, ``direct_two_core_bound_GBps``); checked page by page as it is
    read (``get_scattered``'s ``each``, as a load checks), each page is still in cache:
    ``direct_in_cache_GBps``, both passes on one core. With ``pieces`` > 1 (SGLang: a
    page's payload lies in 2 x layers pools, one run of rows in each; vLLM: one run in each
    layer's blocks) the same read and check with each page's payload read into ``pieces``
    runs, one in each of ``pieces`` arrays, as a load into the engine's KV writes it and
    checked as the load checks it: ``direct_in_layout_GBps``. And
    ``read_beside_memcpy_GBps`` is the read while another thread makes one memcpy of as many
    bytes: an upper bound on what that overlap is worth (an engine's landing is many smaller
    copies, whose Python between calls holds the GIL the read needs)."""
    import os

    import torch

    from radixlink.stores import open_store
    from radixlink.stores.seal import Sealer

    with open_store(url) as store:
        keys = sorted(key for key, _ in store.scan())
        sizes = [len(v or b"") for v in store.get(keys[:1])]
        size = sizes[0]
        buf = np.empty(len(keys) * size, dtype=np.uint8)
        views = [memoryview(buf)[i * size:(i + 1) * size] for i in range(len(keys))]
        read = min(_timed(lambda: store.get_into(keys, views)) for _ in range(repeat))
        dst, side = np.empty_like(buf), np.empty_like(buf)
        np.copyto(side, buf)
        both = min(_together(lambda: store.get_into(keys, views), lambda: np.copyto(dst, side))
                   for _ in range(repeat))
        secret = store.page_secret
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(allowed)})  # NOTE: this thread only, restored below
        try:
            one_read = min(_timed(lambda: store.get_into(keys, views)) for _ in range(repeat))
            import xxhash

            sealer = Sealer(secret) if secret is not None else None

            def one(i: int, _: int | None = None) -> None:
                if sealer is not None:
                    sealer.tag(keys[i], views[i])
                else:
                    xxhash.xxh3_64_intdigest(views[i])

            one_check = min(_timed(lambda: list(map(one, range(len(keys)))))
                            for _ in range(repeat))
            whole = [[view] for view in views]
            in_cache = min(_timed(lambda: store.get_scattered(keys, whole, one))
                           for _ in range(repeat))
            in_layout = None
            if pieces > 1:
                layout = _in_layout(store, keys, size, pieces, sealer)
                in_layout = min(_timed(layout) for _ in range(repeat + 1))  # NOTE: 1st faults
            blocks = torch.empty(buf.nbytes, dtype=torch.uint8)  # NOTE: 4 KiB pages, as vLLM's
            src = torch.from_numpy(buf)
            one_copy = min(_timed(lambda: blocks.copy_(src)) for _ in range(repeat + 1))
        finally:
            os.sched_setaffinity(0, allowed)
    copy = min(_timed(lambda: np.copyto(dst, buf)) for _ in range(repeat))
    gbps = lambda seconds: round(buf.nbytes / seconds / 1e9, 2)  # noqa: E731
    return {"bytes": int(buf.nbytes), "read_GBps": gbps(read), "memcpy_GBps": gbps(copy),
            "read_beside_memcpy_GBps": gbps(both),
            "one_core": {"read_GBps": gbps(one_read), "check_GBps": gbps(one_check),
                         "copy_GBps": gbps(one_copy),
                         "bound_GBps": gbps(one_read + one_check + one_copy),
                         "two_core_bound_GBps": gbps(max(one_read, one_check + one_copy)),
                         "direct_bound_GBps": gbps(one_read + one_check),
                         "direct_two_core_bound_GBps": gbps(max(one_read, one_check)),
                         "direct_in_cache_GBps": gbps(in_cache),
                         "direct_in_layout_GBps": gbps(in_layout) if in_layout else None}}


def _in_layout(store: Any, keys: list[str], size: int, pieces: int,
               sealer: Any) -> Callable[[], Any]:
    """A read of every page with its payload in ``pieces`` runs, page i's run j at row i of
    array j (a pool's slots, in order), each page checked as a load checks it: xxh3 over the
    runs one after another, fed run by run as the store reads them where it ``reads_in_parts``
    (``pagefiles.PART_BYTES``), or the seal's tag once it is read (``Sealer.tag`` joins them
    first). Unsealed, from a store with ``get_scattered_xxh3`` (the directory's compiled
    loop), the read is that call, as a load's is."""
    import xxhash

    from radixlink.stores.pageformat import HEADER_BYTES

    run = (size - HEADER_BYTES) // pieces
    rest = size - HEADER_BYTES - pieces * run  # NOTE: a sealed page's tag, else 0
    arrays = [np.empty(len(keys) * run, dtype=np.uint8) for _ in range(pieces)]
    ends = memoryview(bytearray(len(keys) * (HEADER_BYTES + rest)))
    targets, payloads = [], []
    for i in range(len(keys)):
        head = ends[i * (HEADER_BYTES + rest) : (i + 1) * (HEADER_BYTES + rest)]
        rows = tuple(memoryview(a)[i * run : (i + 1) * run] for a in arrays)
        targets.append([head[:HEADER_BYTES], *rows, head[HEADER_BYTES:]])
        payloads.append(rows)

    running: list[Any] = [None, 0]  # NOTE: the page being read in runs: its xxh3, rows fed

    def fed(i: int, n: int) -> None:  # NOTE: as pageio.read_scattered feeds a load's check
        if running[0] is None:
            running[:] = [xxhash.xxh3_64(), 0]
        h, done = running
        for row in payloads[i][done : n - 1]:
            h.update(row)
        running[1] = max(done, min(n - 1, pieces))

    def check(i: int, _: int | None = None) -> None:
        if sealer is not None:
            sealer.tag(keys[i], payloads[i])
            return
        h, done = running
        running[:] = [None, 0]
        if h is None:
            h = xxhash.xxh3_64()
        for row in payloads[i][done:]:
            h.update(row)
        h.intdigest()

    if sealer is None and store.get_scattered_xxh3(keys[:1], targets[:1]) is not None:
        return lambda: store.get_scattered_xxh3(keys, targets)
    if sealer is None and store.reads_in_parts:
        return lambda: store.get_scattered(keys, targets, check, part=fed)
    return lambda: store.get_scattered(keys, targets, check)


def _together(first: Callable[[], Any], second: Callable[[], Any]) -> float:
    """Seconds until both ran, ``second`` on a thread of its own (started first)."""
    import threading

    thread = threading.Thread(target=second)
    start = time.perf_counter()
    thread.start()
    first()
    thread.join()
    return time.perf_counter() - start


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
