"""What a request sees of its load, the one home of these outcome types: its ``LoadOutcome``
(the restored prefix and a lock on it, or its own device prefix and reason on failure) and,
while the load lands, its ``Landing``; and the builders of both.

Owns these records and building them from a finished (or landing) transfer (``loads.Member``
/ ``loads.Transfer``, read by attribute). Takes locks for the outcomes it builds; must not
touch stores, threads or the load table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from radixlink.contract import MatchResult, PoolName
from radixlink.linker.progress import LayerProgress
from radixlink.linker.worker import Completion


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



def success_outcomes(cache: Any, transfer: Any) -> list[LoadOutcome]:
    """Per member of a published transfer: the restored prefix (read-only peek), a lock on it
    taken for the member, and the member's own lock on its device prefix released."""
    lookup = transfer.reservation.lookup
    match = cache.peek_prefix(lookup.tokens, namespace=lookup.namespace)
    loaded_len = max(0, match.prefix_len - lookup.prefix_len)
    out = []
    for member in transfer.members:
        handle = cache.lock(match.last_node)
        cache.unlock(member.handle)
        out.append(LoadOutcome(
            req_id=member.req_id, ok=True, prefix_len=match.prefix_len,
            device_indices=match.device_indices, last_node=match.last_node, lock=handle,
            loaded_len=loaded_len, match=match,
        ))
    return out


def failure_outcome(member: Any, reason: str) -> LoadOutcome:
    """The member's own device prefix, under its own lock (which the outcome hands over)."""
    return LoadOutcome(
        req_id=member.req_id, ok=False, prefix_len=member.lookup.prefix_len,
        device_indices=member.device_slots, last_node=member.handle.node, lock=member.handle,
        reason=reason,
    )


def failure_reason(done: Completion, transfer: Any, closed: bool) -> str:
    """Why a finished transfer is not published (it failed here or on another rank)."""
    if not done.ok:
        return done.detail or done.status.value
    return "cancelled" if transfer.cancelled else "closed" if closed else "another rank failed"


def landing(member: Any, progress: LayerProgress | None) -> Landing | None:
    """Where ``member``'s load is landing (device prefix + reserved slots) and its per-layer
    wait; None when the transfer has no landing progress or no FULL slots."""
    transfer = member.transfer
    if transfer is None or progress is None:
        return None
    reservation = transfer.reservation
    full = reservation.full
    if full is None or full.device_indices is None:
        return None
    lookup = reservation.lookup
    progress.watch()
    return Landing(req_id=member.req_id, prefix_len=len(lookup.tokens),
                   loaded_len=len(lookup.tokens) - lookup.prefix_len,
                   device_indices=torch.cat([reservation.device_slots, full.device_indices]),
                   progress=progress)
