"""`radixlink demo`: the main job. Until the reference engine lands this runs a small
end-to-end scenario over the foundation: node A computes pages, exports them by page hash,
node B finds them by hash and imports them byte-identically."""

from __future__ import annotations

import argparse

import torch

from radixlink.hashing import page_hashes
from radixlink.memory import KVLayout, KVPool, PagedAllocator


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="radixlink demo")
    parser.add_argument("--tokens", type=int, default=1000, help="prompt length")
    parser.add_argument("--page-size", type=int, default=16)
    args = parser.parse_args(argv)
    layout = KVLayout(num_layers=4, num_kv_heads=2, head_dim=64, dtype=torch.float16,
                      page_size=args.page_size)
    nodes = []
    for _ in range(2):
        alloc = PagedAllocator(4096, args.page_size)
        nodes.append((alloc, KVPool(layout, alloc.num_slots)))
    prompt = torch.randint(0, 32000, (args.tokens,), generator=torch.Generator().manual_seed(0))
    hashes = page_hashes(prompt, args.page_size)
    whole = len(hashes) * args.page_size

    alloc_a, pool_a = nodes[0]
    slots_a = alloc_a.alloc(whole)
    assert slots_a is not None
    for layer in range(layout.num_layers):  # "prefill": deterministic K/V per token
        pool_a.k(layer)[slots_a] = prompt[:whole, None, None].to(torch.float16) + layer
        pool_a.v(layer)[slots_a] = -prompt[:whole, None, None].to(torch.float16) - layer
    store = dict(zip(hashes, pool_a.read_pages(slots_a).clone()))

    alloc_b, pool_b = nodes[1]
    found = [h for h in page_hashes(prompt, args.page_size) if h in store]
    slots_b = alloc_b.alloc(len(found) * args.page_size)
    assert slots_b is not None
    pool_b.write_pages(slots_b, torch.stack([store[h] for h in found]))
    same = all(
        torch.equal(pool_a.k(layer)[slots_a], pool_b.k(layer)[slots_b])
        and torch.equal(pool_a.v(layer)[slots_a], pool_b.v(layer)[slots_b])
        for layer in range(layout.num_layers)
    )
    print(f"node A computed {whole} tokens ({len(hashes)} pages of {args.page_size}); "
          f"node B found {len(found)} pages by hash and loaded "
          f"{len(found) * layout.page_bytes / 2**20:.1f} MiB")
    print(f"K/V on node B identical to node A: {same}")
    return 0 if same and len(found) == len(hashes) else 1
