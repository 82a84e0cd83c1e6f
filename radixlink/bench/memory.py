"""`radixlink bench memory`: KVPool page gather/scatter bandwidth next to a plain torch copy.

Owns only this benchmark; measures radixlink.memory through its public API.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch

from radixlink.bench.common import (
    add_common_args,
    best_of_interleaved,
    machine_info,
    print_table,
    write_json,
)
from radixlink.cmdargs import CommandParser, int_at_least
from radixlink.memory import KVLayout, KVPool

TARGET_RATIO = 0.8
# Default model: 4 layers, 8 KV heads of 128, fp16 -> 16 KiB per token, so page sizes of
# 1 / 4 / 16 tokens give 16 / 64 / 256 KiB pages. A page is 2 * layers rows (K and V of each
# layer) of page_bytes / (2 * layers) bytes each, scattered over the pool: row size, not page
# size, sets the gather speed on a CPU.
PAGE_SIZES = (1, 4, 16)


def _layout(args: argparse.Namespace, page_size: int) -> KVLayout:
    return KVLayout(
        num_layers=args.num_layers,
        num_kv_heads=args.num_kv_heads,
        head_dim=args.head_dim,
        dtype=torch.float16,
        page_size=page_size,
    )


def _timed(fn: Callable[[], object], device: torch.device) -> Callable[[], object]:
    if device.type != "cuda":
        return fn

    def run() -> object:
        fn()
        torch.cuda.synchronize(device)
        return None

    return run


def _measure(
    layout: KVLayout, mib: int, repeat: int, device: torch.device, seed: int
) -> dict[str, Any]:
    page_size = layout.page_size
    num_pages = max(1, (mib << 20) // layout.page_bytes)
    # Twice the pages we move, so the gather picks a random half of the pool (+ padding page 0).
    pool = KVPool(layout, (2 * num_pages + 1) * page_size, device=device)
    gen = torch.Generator().manual_seed(seed * 1000 + page_size)
    raw = pool.storage.view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    pages = torch.randperm(2 * num_pages, generator=gen)[:num_pages] + 1
    slots = (pages[:, None] * page_size + torch.arange(page_size)).reshape(-1).to(device)

    pin = device.type == "cuda"
    host_buf = torch.empty((num_pages, layout.page_bytes), dtype=torch.uint8, pin_memory=pin)
    pool.read_pages(slots, out=host_buf)
    assert torch.equal(pool.read_pages(slots), host_buf), "read_pages is not deterministic"
    # Baselines move the same bytes between the same tiers: device -> host and host -> device.
    nbytes = num_pages * layout.page_bytes
    dev_src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(generator=None)
    dev_dst = torch.empty_like(dev_src)
    host_flat = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
    cases = {
        "gather": lambda: pool.read_pages(slots, out=host_buf),
        "gather_alloc": lambda: pool.read_pages(slots),
        "scatter": lambda: pool.write_pages(slots, host_buf),
        "copy_out": lambda: host_flat.copy_(dev_src),
        "copy_in": lambda: dev_dst.copy_(host_flat),
    }
    best = best_of_interleaved({k: _timed(v, device) for k, v in cases.items()}, repeat=repeat)
    assert torch.equal(pool.read_pages(slots), host_buf), "write_pages did not round-trip"
    pool.write_pages(slots, host_flat.view(num_pages, -1))
    assert torch.equal(pool.read_pages(slots).view(-1), host_flat), "write_pages lost bytes"
    gbps = {k: nbytes / 1e9 / v for k, v in best.items()}
    return {
        "page_KiB": layout.page_bytes >> 10,
        "page_size": page_size,
        "pages": num_pages,
        "row_KiB": layout.page_bytes / (2 * layout.num_layers) / 1024,
        "MiB": nbytes >> 20,
        "gather_GBps": gbps["gather"],
        "gather_alloc_GBps": gbps["gather_alloc"],
        "copy_out_GBps": gbps["copy_out"],
        "gather_ratio": gbps["gather"] / gbps["copy_out"],
        "scatter_GBps": gbps["scatter"],
        "copy_in_GBps": gbps["copy_in"],
        "scatter_ratio": gbps["scatter"] / gbps["copy_in"],
    }


def main(argv: list[str]) -> int:
    positive = int_at_least(1)
    parser = CommandParser(prog="radixlink bench memory", description=__doc__)
    parser.add_argument("--mib", type=positive, default=128, help="MiB moved per measurement")
    parser.add_argument("--repeat", type=positive, default=9, help="timed rounds (best is kept)")
    parser.add_argument("--num-layers", type=positive, default=4)
    parser.add_argument("--num-kv-heads", type=positive, default=8)
    parser.add_argument("--head-dim", type=positive, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--page-sizes", type=positive, nargs="+", default=list(PAGE_SIZES))
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    add_common_args(parser)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    layout = _layout(args, 1)
    print(
        f"bench memory: device={device} threads={torch.get_num_threads()} mib={args.mib} "
        f"repeat={args.repeat} layout L{layout.num_layers} H{layout.num_kv_heads} "
        f"D{layout.head_dim} {layout.dtype} token={layout.token_bytes} B; "
        f"gather=read_pages(out=), scatter=write_pages, copy=dst.copy_(src) same bytes"
    )
    rows = [
        _measure(_layout(args, ps), args.mib, args.repeat, device, args.seed)
        for ps in args.page_sizes
    ]
    print_table(rows, f"KVPool page transfer vs plain copy (target ratio >= {TARGET_RATIO})")
    if args.json:
        write_json(
            args.json,
            {
                "bench": "memory",
                "device": str(device),
                "mib": args.mib,
                "machine": machine_info(),
                "rows": rows,
            },
        )
    return 0
