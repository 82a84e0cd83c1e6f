"""Records of the linker: what a lookup found, a load in flight, an offload in flight, the
``LoadOutcome`` and ``Landing`` handed to the engine; plus the pool adapters that move page
bytes between pools and staging frames.

Owns plain data and byte movement between pools and host buffers. Must not touch the tree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from radixlink.contract import MatchResult, PoolName, PoolTransfer
from radixlink.linker.progress import LayerProgress
from radixlink.linker.staging import Frames
from radixlink.memory.pools import KVPool, MambaStatePool


@dataclass(slots=True, kw_only=True)
class LoadOutcome:
    """A finished load, as ``poll`` / ``wait_load`` return it. The caller owns ``lock``.

    Attributes:
        req_id: the request.
        ok: the store's pages arrived, were verified and are now in the tree.
        prefix_len: tokens of the request now on device (device match + loaded), page aligned.
            On failure, the device prefix the request had when it called ``load``.
        device_indices: the tree's canonical full-pool slots for ``[0, prefix_len)``.
        last_node: where that prefix ends (on a MAMBA cache, take the request's own state with
            ``cache.hybrid.copy_state(last_node)`` when ``prefix_len > 0``).
        lock: the lock on ``last_node`` taken for the caller; pass it to ``cache.unlock``.
        loaded_len: tokens that came from the store (0 on failure).
        match: a read-only match of the restored prefix (SWA window slots, the tree's Mamba
            state slot), or None on failure.
        reason: why the load failed ("" when ok).
    """

    req_id: Any
    ok: bool
    prefix_len: int
    device_indices: torch.Tensor
    last_node: Any
    lock: Any
    loaded_len: int = 0
    match: MatchResult | None = None
    reason: str = ""


@dataclass(slots=True, kw_only=True)
class Lookup:
    """What ``match_prefix(req_id=...)`` found in the store for one request.

    ``keys`` are the chained page hashes of the restorable tail (``num_pages`` of them),
    page 0 = first device-uncached page; ``namespace`` is the resolved (layered) one.
    """

    tokens: Any  # numpy uint32 copy of the whole-page key, [0, prefix_len + num_pages * ps)
    prefix_len: int
    last_node: Any
    keys: list[str]
    namespace: Any = None
    created: float = 0.0  # time.monotonic() of the lookup

    @property
    def num_pages(self) -> int:
        return len(self.keys)

    @property
    def num_bytes(self) -> int:
        """Host memory this lookup pins while remembered (tokens and key strings)."""
        return int(self.tokens.nbytes) + sum(len(k) + 49 for k in self.keys)

    @property
    def signature(self) -> tuple[str, int, int]:
        """Identifies the pages and where they start: the last chained hash names the whole
        prefix (namespace included)."""
        return (self.keys[-1], len(self.keys), self.prefix_len)


@dataclass(slots=True, kw_only=True)
class Offload:
    """One offload in flight: the nodes it covers (split fragments are added by the tree's
    ``on_split`` as they appear) and the bytes it counts against the budget."""

    ticket: int
    nodes: list[Any]
    num_bytes: int
    num_pages: int
    written: list[tuple[PoolName, Sequence[str]]]  # (pool, page hashes) it writes, known skipped
    ready: Any = None  # CUDA: the event of the gather into staging (None on CPU)


@dataclass(frozen=True, slots=True, kw_only=True)
class Landing:
    """Where a load in flight is landing, for an engine that computes layer by layer while
    the pages arrive (``ExternalCacheLinker.landing``). Valid until ``wait_load`` / ``poll``
    returns the outcome: then use the outcome's (canonical) slots.

    ::

        device_indices |-- device prefix (locked) --|-- reserved slots (being written) --|
                       0                     prefix_len - loaded_len               prefix_len

    Attributes:
        req_id: the request.
        prefix_len: tokens device prefix + loaded tail, page aligned.
        loaded_len: tokens coming from the store.
        device_indices: full-pool slots of ``[0, prefix_len)`` (read them, never free them).
        progress: per pool and layer, what has landed.
    """

    req_id: Any
    prefix_len: int
    loaded_len: int
    device_indices: torch.Tensor
    progress: LayerProgress

    def wait_layer(self, pool: PoolName, layer: int, timeout: float | None = None) -> bool:
        """Block until layer ``layer`` of ``pool`` has landed (on CUDA: the current stream
        waits for it). False when the load failed or was cancelled (recompute instead)."""
        return self.progress.wait(pool, layer, timeout)


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
