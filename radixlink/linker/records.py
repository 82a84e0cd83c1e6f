"""The pool adapters of the linker: page bytes between pools and staging frames, a pool's page
size, fingerprint and replication, and the KV bytes a loaded token brings. (What a lookup
found is ``lookup.Lookup``; an offload in flight ``offload.Offload``; what the engine gets back
``outcomes.LoadOutcome`` / ``Landing``.)

Owns byte movement between pools and host buffers. Must not touch the tree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from radixlink.contract import PoolName, PoolTransfer
from radixlink.linker.staging import Frames
from radixlink.memory.pools import KVPool, MambaStatePool


def page_ids(slots: torch.Tensor, page_size: int) -> Any:
    """Page ids of whole-page slot runs the tree handed out (no checks: the tree's own): a
    numpy array for CPU slots (cheaper to index with), else a tensor on their device."""
    if slots.device.type == "cpu":
        return slots.numpy()[::page_size] // page_size
    return slots[::page_size].div(page_size, rounding_mode="floor")


def gather_pages(pool: Any, parts: list[Any], frames: Frames) -> None:
    """Copy pages out of ``pool`` into the payloads of ``frames``: ``parts`` are page-id
    tensors (KV, SWA) or one-slot tensors (MAMBA), in frame order. On CUDA the copy is only
    queued on the current stream."""
    payloads = frames.payloads()
    if isinstance(pool, MambaStatePool):
        for row, slot in enumerate(parts):
            pool.read_state(int(slot.reshape(-1)[0]), out=payloads[row])
        return
    assert isinstance(pool, KVPool), f"no page adapter for {type(pool).__name__}"
    if len(parts) == 1:
        pool.gather(parts[0], payloads)
    elif isinstance(parts[0], np.ndarray):
        pool.gather(np.concatenate(parts), payloads)
    else:
        pool.gather(torch.cat(parts), payloads)


def pool_lander(pool: Any, transfer: PoolTransfer,
                frames: Frames) -> tuple[Callable[[int | None], None], int]:
    """A function writing the verified payloads of ``frames`` into the transfer's reserved
    slots (one layer, or all with None; called on a worker thread: the slots are reserved,
    nobody else uses them), and the pool's layer count (0: it lands whole)."""
    slots = transfer.device_indices
    assert slots is not None, f"LOAD transfer of {transfer.name} has no device slots"
    payloads = frames.payloads()
    if isinstance(pool, MambaStatePool):
        slot = int(slots.reshape(-1)[0])
        return (lambda layer: pool.write_state(slot, payloads[0])), 0
    assert isinstance(pool, KVPool), f"no page adapter for {type(pool).__name__}"
    pages = page_ids(slots, pool.page_size)
    staged: list[torch.Tensor] = []

    def land(layer: int | None) -> None:
        if not staged:  # NOTE: one host-to-device copy of all pages, then a scatter per layer
            staged.append(pool.stage(payloads))
        pool.scatter(pages, staged[0], layer)

    return land, pool.layout.num_layers


def pool_page_bytes(pool: Any) -> int:
    if isinstance(pool, MambaStatePool):
        return int(pool.layout.state_bytes)
    return int(pool.layout.page_bytes)


def pool_fingerprint(pool: Any, name: PoolName) -> str:
    return str(pool.layout.fingerprint(name))


def pool_replicated(pool: Any) -> bool:
    return bool(getattr(pool.layout, "replicated", False))


def kv_bytes_per_token(cache: Any) -> int:
    """KV bytes a loaded token brings: the full pool's, plus the SWA pool's (an upper bound:
    a load brings SWA pages for the window only)."""
    total = 0
    for name in (PoolName.KV, PoolName.SWA):
        pool = cache.pool(name)
        if pool is not None:
            total += int(pool.layout.token_bytes)
    return max(total, 1)
