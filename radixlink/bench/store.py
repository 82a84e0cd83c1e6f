"""``radixlink bench store --store URL``: store put/get GB/s through the page codec, beside the
raw figure for the same bytes on the same backend, measured in one run.

Raw baselines: memory -> memcpy of the bytes; file -> plain write/read of one file per page;
redis / redis+cluster -> redis-py pipelined SET/GET of the raw bytes; other stores -> memcpy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from radixlink.bench.common import (
    add_common_args,
    machine_info,
    print_table,
    write_json,
)
from radixlink.contract import PoolName
from radixlink.stores import PageCodec, Store, open_store, page_key, parse_size
from radixlink.stores.directory import DirectoryStore
from radixlink.stores.memory import MemoryStore

Op = Callable[[], object]


def _best_alternating(cases: dict[str, Op], repeat: int) -> dict[str, float]:
    """Best seconds per case; rounds run the cases forward, then backward, and so on, so
    that neither the store nor the raw side always runs right after the other's writes."""
    for fn in cases.values():
        fn()  # warm-up
    best = dict.fromkeys(cases, float("inf"))
    names = list(cases)
    for r in range(repeat):
        for name in names if r % 2 == 0 else reversed(names):
            start = time.perf_counter()
            cases[name]()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


class Rounds:
    """Fresh keys for every timed round: the linker writes pages the store does not hold
    (keys are content hashes), so overwriting one key set again and again would measure a
    pattern that does not happen. ``put`` moves to the next round; ``get`` reads the last."""

    def __init__(self, pages: list[memoryview], num_rounds: int, page_bytes: int, prefix: str):
        self.pages = pages
        self.keys = [
            [
                page_key("b3nch", f"{page_bytes:08x}{r:08x}{i:048x}", PoolName.KV)
                for i in range(len(pages))
            ]
            for r in range(num_rounds)
        ]
        self.prefix = prefix
        self.put_round = -1

    def next_put(self) -> list[str]:
        self.put_round += 1
        assert self.put_round < len(self.keys), "more put rounds than planned"
        return [self.prefix + k for k in self.keys[self.put_round]]

    def last_put(self) -> list[str]:
        return [self.prefix + k for k in self.keys[max(self.put_round, 0)]]

    def all_keys(self) -> list[str]:
        return [self.prefix + k for keys in self.keys for k in keys]


def _batches(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _store_ops(store: Store, codec: PageCodec, rounds: Rounds, batch: int) -> tuple[Op, Op]:
    def put() -> None:
        items = list(zip(rounds.next_put(), rounds.pages, strict=True))
        for b in _batches(items, batch):
            store.put({k: codec.encode(page) for k, page in b})

    def get() -> None:
        for keys in _batches(rounds.last_put(), batch):
            views = [codec.decode(blob) for blob in store.get(keys)]
            assert all(view is not None for view in views), "page missing: raise the capacity"

    return put, get


def _memcpy_ops(rounds: Rounds) -> tuple[Op, Op, Op, str]:
    held: dict[str, bytes] = {}

    def put() -> None:
        for k, page in zip(rounds.next_put(), rounds.pages, strict=True):
            held[k] = bytes(page)

    dest = bytearray(len(rounds.pages[0]))

    def get() -> None:
        for k in rounds.last_put():
            dest[:] = held[k]  # memcpy into a preallocated buffer, as into a pool

    return put, get, held.clear, "memcpy"


def _file_ops(root: str, rounds: Rounds, batch: int) -> tuple[Op, Op, Op, str]:
    os.makedirs(root, exist_ok=True)

    def path(key: str) -> str:
        return os.path.join(root, key.replace("/", "_"))

    def put() -> None:
        for k, page in zip(rounds.next_put(), rounds.pages, strict=True):
            with open(path(k), "wb") as f:
                f.write(page)

    def get() -> None:
        # NOTE: a batch of pages stays alive until the batch is done, as a store's get
        # returns them; dropping each read at once lets malloc reuse one warm buffer and
        # reads ~5x faster than any real consumer (see docs/stores.md, malloc tuning).
        for keys in _batches(rounds.last_put(), batch):
            batch_data = []
            for k in keys:
                with open(path(k), "rb") as f:
                    batch_data.append(f.read())

    return put, get, lambda: shutil.rmtree(root, ignore_errors=True), "write/read files"


def _redis_ops(client: Any, rounds: Rounds, batch: int) -> tuple[Op, Op, Op, str]:
    def put() -> None:
        items = list(zip(rounds.next_put(), rounds.pages, strict=True))
        for b in _batches(items, batch):
            pipe = client.pipeline(transaction=False)
            for k, page in b:
                pipe.set(k, page)
            pipe.execute()

    def get() -> None:
        for keys in _batches(rounds.last_put(), batch):
            pipe = client.pipeline(transaction=False)
            for k in keys:
                pipe.get(k)
            pipe.execute()

    def cleanup() -> None:
        for keys in _batches(rounds.all_keys(), 1024):
            client.delete(*keys)

    return put, get, cleanup, "redis-py pipelined SET/GET"


def _raw_ops(store: Store, rounds: Rounds, batch: int) -> tuple[Op, Op, Op, str]:
    """Raw put, raw get, cleanup and the baseline's name, for the store's backend."""
    if isinstance(store, MemoryStore):
        return _memcpy_ops(rounds)
    if isinstance(store, DirectoryStore):
        return _file_ops(store.root.rstrip("/") + ".rawbench", rounds, batch)
    client = getattr(store, "client", None)
    if client is not None and hasattr(client, "pipeline"):
        return _redis_ops(client, rounds, batch)
    put, get, cleanup, _ = _memcpy_ops(rounds)
    return put, get, cleanup, f"memcpy (no native raw baseline for {type(store).__name__})"


def _bench_page_size(store: Store, args: argparse.Namespace, page_bytes: int) -> list[dict]:
    num_pages = max(1, args.total // page_bytes)
    gen = torch.Generator().manual_seed(args.seed)
    data = torch.randint(0, 256, (num_pages, page_bytes), dtype=torch.uint8, generator=gen)
    pages = [data[i].numpy().data for i in range(num_pages)]
    num_rounds = args.repeat + 1  # one warm-up round
    store_rounds = Rounds(pages, num_rounds, page_bytes, prefix="")
    raw_rounds = Rounds(pages, num_rounds, page_bytes, prefix="rawbench:")
    codec = PageCodec(f"bench-{page_bytes}", page_bytes)
    store_put, store_get = _store_ops(store, codec, store_rounds, args.batch)
    raw_put, raw_get, raw_cleanup, raw_name = _raw_ops(store, raw_rounds, args.batch)
    blobs = [codec.encode(page) for page in pages]
    try:
        times = _best_alternating(
            {
                "store put": store_put,
                "raw put": raw_put,
                "codec put": lambda: [codec.encode(page) and None for page in pages],
                "store get": store_get,
                "raw get": raw_get,
                "codec get": lambda: [codec.decode(blob) for blob in blobs],
            },
            repeat=args.repeat,
        )
    finally:
        for keys in _batches(store_rounds.all_keys(), 1024):
            store.delete(keys)
        raw_cleanup()
    total_gb = num_pages * page_bytes / 1e9
    rows = []
    for op in ("put", "get"):
        store_gbs, raw_gbs = total_gb / times[f"store {op}"], total_gb / times[f"raw {op}"]
        rows.append(
            {
                "page": f"{page_bytes >> 10} KiB",
                "op": op,
                "store GB/s": store_gbs,
                "raw GB/s": raw_gbs,
                "store/raw": store_gbs / raw_gbs,
                "codec-only GB/s": total_gb / times[f"codec {op}"],
                "raw baseline": raw_name,
            }
        )
    return rows


def main(argv: list[str]) -> int:
    """Entry point of ``radixlink bench store``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="radixlink bench store", description=__doc__)
    parser.add_argument("--store", default="memory://?capacity=1GiB", help="store URL")
    parser.add_argument("--page-sizes", default="64KiB,256KiB", help="comma-separated sizes")
    parser.add_argument("--total", default="64MiB", help="bytes written per page size")
    parser.add_argument("--batch", type=int, default=32, help="pages per store call")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds (best is kept)")
    parser.add_argument("--seed", type=int, default=0)
    add_common_args(parser)
    args = parser.parse_args(argv)
    args.total = parse_size(args.total)
    page_sizes = [parse_size(size) for size in args.page_sizes.split(",")]
    checksum = PageCodec("probe", 1).checksum
    print(
        f"bench store: store={args.store} total={args.total >> 20} MiB per page size "
        f"batch={args.batch} repeat={args.repeat} seed={args.seed} checksum={checksum}"
    )
    with open_store(args.store) as store:
        rows = [row for size in page_sizes for row in _bench_page_size(store, args, size)]
    print_table(rows, f"store throughput through the codec vs raw ({type(store).__name__})")
    if args.json:
        config = {k: v for k, v in vars(args).items() if k != "json"}
        write_json(args.json, {"config": config, "machine": machine_info(), "rows": rows})
    return 0
