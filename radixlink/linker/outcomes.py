"""What a request sees of its load: its ``LoadOutcome`` (the restored prefix and a lock on it,
or its own device prefix and reason on failure) and, while the load lands, its ``Landing``.

Owns building these records from a finished (or landing) transfer. Takes locks for the
outcomes it builds; must not touch stores, threads or the load table.
"""

from __future__ import annotations

from typing import Any

import torch

from radixlink.linker.loads import Member, Transfer
from radixlink.linker.progress import LayerProgress
from radixlink.linker.records import Landing, LoadOutcome
from radixlink.linker.worker import Completion


def success_outcomes(cache: Any, transfer: Transfer) -> list[LoadOutcome]:
    """Per member of a published transfer: the restored prefix (read-only peek), a lock on it
    taken for the member, and the member's own lock on its device prefix released."""
    lookup = transfer.reservation.lookup
    match = cache.match_prefix(lookup.tokens, namespace=lookup.namespace, touch=False)
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


def failure_outcome(member: Member, reason: str) -> LoadOutcome:
    """The member's own device prefix, under its own lock (which the outcome hands over)."""
    return LoadOutcome(
        req_id=member.req_id, ok=False, prefix_len=member.lookup.prefix_len,
        device_indices=member.device_slots, last_node=member.handle.node, lock=member.handle,
        reason=reason,
    )


def failure_reason(done: Completion, transfer: Transfer, closed: bool) -> str:
    """Why a finished transfer is not published (it failed here or on another rank)."""
    if not done.ok:
        return done.detail or done.status.value
    return "cancelled" if transfer.cancelled else "closed" if closed else "another rank failed"


def landing(member: Member, progress: LayerProgress | None) -> Landing | None:
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
