"""Records of the linker: what a lookup found, a load in flight, an offload in flight, and the
``LoadOutcome`` handed to the engine; plus the pool adapters that move page bytes.

Owns plain data and byte movement between pools and host buffers. Must not touch the tree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from radixlink.contract import MatchResult, PoolName, PoolTransfer
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
            ``cache.copy_state(last_node)`` when ``prefix_len > 0``).
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


def pool_payloads(pool: Any, transfer: PoolTransfer) -> list[torch.Tensor]:
    """Copy a transfer's pages out of ``pool`` into host memory, one uint8 row per key."""
    slots = transfer.device_indices
    assert slots is not None, f"OFFLOAD transfer of {transfer.name} has no device slots"
    if isinstance(pool, MambaStatePool):
        return [pool.read_state(int(slots.reshape(-1)[0]))]
    assert isinstance(pool, KVPool), f"no page adapter for {type(pool).__name__}"
    return list(pool.read_pages(slots))


def pool_writer(pool: Any, transfer: PoolTransfer) -> Callable[[torch.Tensor], None]:
    """A function that writes a ``[num_pages, page_bytes]`` host buffer into the transfer's
    reserved slots (called on a worker thread; the slots are reserved, nobody else uses them)."""
    slots = transfer.device_indices
    assert slots is not None, f"LOAD transfer of {transfer.name} has no device slots"
    if isinstance(pool, MambaStatePool):
        slot = int(slots.reshape(-1)[0])
        return lambda data: pool.write_state(slot, data[0])
    assert isinstance(pool, KVPool), f"no page adapter for {type(pool).__name__}"
    return lambda data: pool.write_pages(slots, data)


def pool_page_bytes(pool: Any) -> int:
    if isinstance(pool, MambaStatePool):
        return int(pool.layout.state_bytes)
    return int(pool.layout.page_bytes)


def pool_fingerprint(pool: Any, name: PoolName) -> str:
    return str(pool.layout.fingerprint(name))


def pool_replicated(pool: Any) -> bool:
    return bool(getattr(pool.layout, "replicated", False))
