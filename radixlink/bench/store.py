"""``radixlink bench store --store URL``: store put/get GB/s beside the raw client moving the
same bytes, in one run: the store alone (``put`` of encoded pages held as views of one staging
buffer, ``get_into`` preallocated buffers), and with the page codec (``encode_frames`` in
place + put, get_into + decode); and the codec alone with checksum only, with the key digest
(the v3 format, unsealed), sealed with keyed BLAKE3 (the default seal) and sealed with
HMAC-SHA256 (``mac=hmac-sha256``), side by side in the same rounds; each seal also as a ratio
of the key digest's figure.

Raw baselines (``store_raw.py``): memory -> bytes copy / memcpy; file -> plain open + write /
readv per page, and (second rows) temp file + rename per page, the put atomic for readers
that the store provides, and a nofollow open + fstat + readv, the checked read it provides;
redis / redis+cluster -> redis-py pipelined SET / GET, and (a second row) MGET; other stores
-> memcpy. File stores ``sync`` before every timed round, so no round pays for the kernel
writing back another round's dirty pages.
"""

from __future__ import annotations

import argparse
import os
import random
import struct
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from radixlink.bench.common import (
    add_common_args,
    machine_info,
    print_table,
    write_json,
)
from radixlink.bench.store_raw import raw_ops
from radixlink.cmdargs import CommandParser, int_at_least
from radixlink.contract import PoolName
from radixlink.pages.pageio import Codec, make_codec
from radixlink.stores import Store, open_store, page_key, parse_size
from radixlink.stores.directory import DirectoryStore
from radixlink.stores.pageformat import CHECKSUM_CRC32, CHECKSUM_XXH3, HEADER_BYTES
from radixlink.stores.seal import MAC_IDS

Op = Callable[[], object]


def _best_alternating(cases: dict[str, Op], repeat: int,
                      settle: Callable[[], object] | None = None,
                      pairs: Sequence[tuple[str, str]] = ()) -> dict[str, float]:
    """Best seconds per case; rounds run the cases forward, then backward, and so on, so
    that neither the store nor the raw side always runs right after the other's writes.
    Each of ``pairs`` (a put and the get that reads it) runs as one unit in that order both
    ways. ``settle`` runs (untimed) before every timed case."""
    for fn in cases.values():
        fn()  # warm-up
    best = dict.fromkeys(cases, float("inf"))
    paired = {name for pair in pairs for name in pair}
    units = [(name,) for name in cases if name not in paired]
    units[:0] = list(pairs)
    for r in range(repeat):
        for unit in units if r % 2 == 0 else reversed(units):
            for name in unit:
                if settle is not None:
                    settle()
                start = time.perf_counter()
                cases[name]()
                best[name] = min(best[name], time.perf_counter() - start)
    return best


CACHE_SCRUB = 128 << 20  # bytes written between timed cases: several times a CPU's last cache


def _settle_files() -> Op:
    """Before each timed case of a file store: ``sync``, and a write over ``CACHE_SCRUB``
    bytes, so that no case starts with dirty files or a hot CPU cache left by the one before.

    NOTE: writeback of earlier rounds' files throttles whoever writes next (puts swung
    0.19-2.7x of raw without the sync). Without the scrub, best-of picked the hardened raw
    get of the backward rounds, run right after the codec cases with its destination
    buffers still in a 32 MiB L3: 3.5-4.0 ms against 5.2 ms in forward rounds (256 KiB
    pages), so the store's get read as 0.70-0.78 of it while its plain raw ratio was
    0.85-0.94."""
    scratch = torch.zeros(CACHE_SCRUB, dtype=torch.uint8)

    def settle() -> None:
        os.sync()
        scratch.add_(1)

    return settle


class Rounds:
    """Fresh keys for every timed round: the linker writes pages the store does not hold
    (keys are content hashes), so overwriting one key set again and again would measure a
    pattern that does not happen. ``put`` moves to the next round; ``get`` reads the last."""

    def __init__(self, num_pages: int, num_rounds: int, page_bytes: int, prefix: str):
        self.keys = [
            [
                page_key("b3nch", f"{page_bytes:08x}{r:08x}{i:048x}", PoolName.KV)
                for i in range(num_pages)
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


class Frames:
    """``num_pages`` encoded pages in one buffer at a fixed stride, as the linker's staging
    holds them; ``views`` are what a store gets, ``buffers`` where reads land."""

    def __init__(self, codec: Codec, num_pages: int, seed: int):
        self.codec, self.stride = codec, codec.frame_bytes
        gen = torch.Generator().manual_seed(seed)
        data = torch.randint(0, 256, (num_pages, self.stride), dtype=torch.uint8, generator=gen)
        self.view = data.numpy().data.cast("B")
        self._data = data
        self.views = [self.view[i * self.stride : (i + 1) * self.stride]
                      for i in range(num_pages)]
        out = torch.zeros(num_pages, self.stride, dtype=torch.uint8)
        self._out = out
        flat = out.numpy().data.cast("B")
        self.buffers = [flat[i * self.stride : (i + 1) * self.stride] for i in range(num_pages)]

    def encode(self, keys: list[str]) -> list[memoryview]:
        """Headers (and tags) for ``keys``, written in place: the offload's encode."""
        return self.codec.encode_frames(self.view, self.stride, keys)


def _store_ops(store: Store, frames: Frames, rounds: Rounds, batch: int) -> dict[str, Op]:
    """The store's put / get_into of encoded pages, and the same with the codec's work."""
    def put() -> None:
        keys = rounds.next_put()
        for b in _batches(range(len(keys)), batch):
            store.put({keys[i]: frames.views[i] for i in b})

    def encode_put() -> None:
        keys = rounds.next_put()
        views = frames.encode(keys)
        for b in _batches(range(len(keys)), batch):
            store.put({keys[i]: views[i] for i in b})

    def get(decode: bool) -> Op:
        def run() -> None:
            keys = rounds.last_put()
            for b in _batches(range(len(keys)), batch):
                sizes = store.get_into([keys[i] for i in b], [frames.buffers[i] for i in b])
                if None in sizes:
                    raise ValueError(
                        f"the store no longer holds pages it was just given ({len(keys)} pages "
                        f"of {frames.stride} bytes): give it a capacity of at least twice "
                        "--total, e.g. memory://?capacity=1GiB")
                if decode:
                    ok = [frames.codec.decode(frames.buffers[i][:n], keys[i])
                          for i, n in zip(b, sizes)]
                    assert None not in ok, "page failed verification"
        return run

    return {"put": put, "get": get(False), "encode+put": encode_put,
            "get+decode": get(True)}


class ChecksumOnly:
    """The cost of a page format that checks layout, length and checksum but not the key
    (format v1): one header pack, one checksum pass and one join, as the codec did before key
    digests. A baseline for this benchmark only; the library has no such mode."""

    _HEADER = struct.Struct("<4sBBH16sQQ")

    def __init__(self, codec: Codec):
        self._fn: Callable[[Any], int] = zlib.crc32
        self._kind = CHECKSUM_CRC32
        if codec.checksum == "xxh3":
            import xxhash  # the codec chose xxh3, so it is installed

            self._fn, self._kind = xxhash.xxh3_64_intdigest, CHECKSUM_XXH3
        self._fp = bytes(16)

    def encode(self, page: memoryview) -> bytes:
        header = self._HEADER.pack(b"RXLP", 1, self._kind, 0, self._fp, page.nbytes,
                                   self._fn(page))
        return b"".join((header, page))

    def decode(self, blob: bytes) -> memoryview | None:
        view = memoryview(blob)
        magic, version, _, _, fp, length, digest = self._HEADER.unpack_from(view)
        if magic != b"RXLP" or version != 1 or fp != self._fp:
            return None
        body = view[self._HEADER.size :]
        return body if body.nbytes == length and self._fn(body) == digest else None


def _codec_cases(pages: list[memoryview], keys: list[str], page_bytes: int,
                 seed: int) -> tuple[dict[str, Op], dict[str, str]]:
    """Encode and decode of every page with each page format; and what each is."""
    secret = random.Random(seed).randbytes(32)
    plain = make_codec(f"bench-{page_bytes}", page_bytes)
    v1 = ChecksumOnly(plain)
    v1_blobs = [v1.encode(page) for page in pages]
    cases: dict[str, Op] = {
        "checksum encode": lambda: [v1.encode(page) for page in pages],
        "checksum decode": lambda: [v1.decode(blob) for blob in v1_blobs],
    }
    what = {
        "checksum": f"layout + length + {plain.checksum} (v1 equivalent, no key binding)",
        "key digest": f"v3: + blake2b-128 of the store key ({plain.checksum})",
    }
    codecs = {"key digest": plain}
    for mac in MAC_IDS:  # NOTE: the default seal first
        name = f"sealed {mac}"
        codecs[name] = make_codec(f"bench-{page_bytes}", page_bytes, secret=secret, mac=mac)
        what[name] = f"v3 sealed: {mac} tag over header and payload (per-namespace key), " \
                     "no checksum"
    for name, codec in codecs.items():
        cases[f"{name} encode"], cases[f"{name} decode"] = _encode_decode(codec, pages, keys)
    return cases, what


def _encode_decode(codec: Codec, pages: list[memoryview], keys: list[str]) -> tuple[Op, Op]:
    """Encode of every page, and decode of every page encoded (checked once here)."""
    blobs = [codec.encode(page, k) for page, k in zip(pages, keys, strict=True)]
    assert all(codec.decode(b, k) is not None for b, k in zip(blobs, keys, strict=True))
    return (lambda: [codec.encode(p, k) for p, k in zip(pages, keys)],
            lambda: [codec.decode(b, k) for b, k in zip(blobs, keys)])


def _bench_page_size(
    store: Store, args: argparse.Namespace, page_bytes: int
) -> tuple[list[dict], list[dict]]:
    num_pages = max(1, args.total // page_bytes)
    codec = make_codec(f"bench-{page_bytes}", page_bytes, secret=store.page_secret)
    frames = Frames(codec, num_pages, args.seed)
    num_rounds = 2 * (args.repeat + 1)  # put and encode+put both write; one warm-up each
    store_rounds = Rounds(num_pages, num_rounds, page_bytes, prefix="")
    raw_rounds = Rounds(num_pages, num_rounds, page_bytes, prefix="rawbench:")
    frames.encode(store_rounds.keys[0])  # valid pages, for the raw side too
    ops = _store_ops(store, frames, store_rounds, args.batch)
    raw = raw_ops(store, frames.views, frames.buffers, raw_rounds.next_put,
                  raw_rounds.last_put, raw_rounds.all_keys, args.batch)
    # NOTE: each get runs right after the put that wrote what it reads, in every round and
    # on both sides alike. With the hardened raw get right after its put and every other get
    # one case later, the hardened raw read of 256 KiB pages beat the plain raw read, which
    # makes fewer syscalls, by 10-20%: its pages were still in the CPU cache. Paired in
    # forward rounds only, it ran 4-11% faster in backward rounds (after a codec case, not
    # a put) than in forward ones, and best-of picked those.
    alt = {f"raw alt {op}": raw.alt[op][0] for op in ("put", "get") if op in raw.alt}
    pairs = [("store put", "store get"), ("raw put", "raw get"),
             ("store encode+put", "store get+decode")]
    if "put" in raw.alt and "get" in raw.alt:
        pairs.append(("raw alt put", "raw alt get"))
    pages = [frames.views[i][HEADER_BYTES : HEADER_BYTES + page_bytes] for i in range(num_pages)]
    codec_cases, what = _codec_cases(pages, store_rounds.keys[0], page_bytes, args.seed)
    try:
        times = _best_alternating(
            {"store put": ops["put"], "store get": ops["get"], "raw put": raw.put,
             "raw get": raw.get, "store encode+put": ops["encode+put"],
             "store get+decode": ops["get+decode"], **alt, **codec_cases},
            repeat=args.repeat,
            pairs=pairs,
            settle=_settle_files() if isinstance(store, DirectoryStore) else None,
        )
    finally:
        for keys in _batches(store_rounds.all_keys(), 1024):
            store.delete(keys)
        raw.cleanup()
    total_gb = num_pages * page_bytes / 1e9
    page = f"{page_bytes >> 10} KiB"
    rows = []
    for op, raw_op in (("put", "put"), ("get", "get"), ("encode+put", "put"),
                       ("get+decode", "get")):
        store_gbs = total_gb / times[f"store {op}"]
        raw_gbs = total_gb / times[f"raw {raw_op}"]
        rows.append({"page": page, "op": op, "store GB/s": store_gbs, "raw GB/s": raw_gbs,
                     "store/raw": store_gbs / raw_gbs, "sealed": codec.sealed,
                     "raw baseline": raw.name})
        if raw_op in raw.alt:  # NOTE: the same store figure against the other raw baseline
            alt_gbs = total_gb / times[f"raw alt {raw_op}"]
            rows.append({"page": page, "op": op, "store GB/s": store_gbs, "raw GB/s": alt_gbs,
                         "store/raw": store_gbs / alt_gbs, "sealed": codec.sealed,
                         "raw baseline": raw.alt[raw_op][1]})
    codec_rows = []
    for fmt, desc in what.items():
        encode = total_gb * 1e3 / times[f"{fmt} encode"]
        decode = total_gb * 1e3 / times[f"{fmt} decode"]
        codec_rows.append({
            "page": page, "format": fmt, "encode MB/s": encode, "decode MB/s": decode,
            "encode vs checksum": times["checksum encode"] / times[f"{fmt} encode"],
            "decode vs checksum": times["checksum decode"] / times[f"{fmt} decode"],
            "encode vs key digest": times["key digest encode"] / times[f"{fmt} encode"],
            "decode vs key digest": times["key digest decode"] / times[f"{fmt} decode"],
            "checks": desc,
        })
    return rows, codec_rows


def _page_sizes(text: str) -> list[int]:
    try:
        sizes = [parse_size(part) for part in text.split(",")]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not sizes or min(sizes) < 64:
        raise argparse.ArgumentTypeError(f"page sizes must be >= 64 bytes, got {text!r}")
    return sizes


def _total(text: str) -> int:
    try:
        total = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if total <= 0:
        raise argparse.ArgumentTypeError(f"expected a size > 0, got {text!r}")
    return total


def main(argv: list[str]) -> int:
    """Entry point of ``radixlink bench store``; returns the exit status."""
    parser = CommandParser(prog="radixlink bench store", description=__doc__)
    parser.add_argument("--store", action="append", default=None,
                        help="store URL; repeat it to measure stores side by side in one run "
                        "(default memory://?capacity=1GiB)")
    parser.add_argument("--page-sizes", type=_page_sizes, default="64KiB,256KiB",
                        help="comma-separated sizes")
    parser.add_argument("--total", type=_total, default="64MiB",
                        help="bytes written per page size")
    parser.add_argument("--batch", type=int_at_least(1), default=32, help="pages per store call")
    parser.add_argument("--repeat", type=int_at_least(1), default=5,
                        help="timed rounds (best is kept)")
    parser.add_argument("--seed", type=int, default=0)
    add_common_args(parser)
    args = parser.parse_args(argv)
    urls = args.store or ["memory://?capacity=1GiB"]
    checksum = make_codec("probe", 1).checksum
    print(
        f"bench store: store={', '.join(url.split('?')[0] for url in urls)} "
        f"total={args.total >> 20} MiB per page size batch={args.batch} repeat={args.repeat} "
        f"seed={args.seed} checksum={checksum}"
    )
    rows, codec_rows, names = [], [], []
    for url in urls:
        with open_store(url) as store:
            results = [_bench_page_size(store, args, size) for size in args.page_sizes]
        names.append(type(store).__name__)
        where = url.split("?")[0]
        rows += [{"store": where, **row} for store_rows, _ in results for row in store_rows]
        codec_rows += [row for _, rows_ in results for row in rows_]
    print_table(rows, f"store throughput vs raw, alone and with the codec ({', '.join(names)})")
    print()
    print_table(codec_rows, "page codec alone: checksum only, key digest, sealed (same rounds)")
    if args.json:
        config = {k: v for k, v in vars(args).items() if k != "json"}
        write_json(args.json, {"config": config, "machine": machine_info(), "rows": rows,
                               "codec_rows": codec_rows})
    return 0
