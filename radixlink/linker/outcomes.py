"""What a request sees of its load, the one home of these outcome types: its ``LoadOutcome``
(the restored prefix and a lock on it, or its own device prefix and reason on failure) and,
while the load lands, its ``Landing``. The loader builds them (``loader.py``).

Owns these records only. Must not touch the tree, stores, threads or the load table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from radixlink.contract import MatchResult, PoolName
from radixlink.linker.progress import LayerProgress


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
