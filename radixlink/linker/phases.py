"""The component side of one load, as typed steps over a ``Reservation``: ``prepare`` (reserve
and map slots, lock the device prefix), ``abort`` (release them, in reverse order) and
``publish`` (insert the verified pages after exactly the locked prefix, then COMMIT).

The contract hooks ``build_external_linker_transfer`` / ``update_external_linker_load`` are
called only here. Owns no state; runs on the caller's thread. Must not touch stores or threads.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from radixlink.contract import (
    ExternalLinkerLoadPhase,
    InsertParams,
    InsertResult,
    LinkerTransferPhase,
    PoolName,
    PoolTransfer,
)
from radixlink.linker.records import Lookup

logger = logging.getLogger(__name__)

_PREPARE, _COMMIT, _ABORT = (
    ExternalLinkerLoadPhase.PREPARE,
    ExternalLinkerLoadPhase.COMMIT,
    ExternalLinkerLoadPhase.ABORT,
)


class ShortRestore(ValueError):
    """The publish restored less than the load brought (a component published a short window
    or no state): the load fails, loudly. The insert already took every reserved slot, so
    there is nothing left to ABORT."""


@dataclass(slots=True, kw_only=True)
class Reservation:
    """What PREPARE took for one transfer, and what publish will insert.

    ::

        tokens     |------ device prefix (locked) ------|------- loaded tail -------|
        slots      |  device_slots: the tree's own      |  transfers[0] (FULL)     |
                   0                               prefix_len                  len(tokens)

    Attributes:
        lookup: the lookup this load serves (tokens, keys, namespace).
        device_slots: the tree's full slots of ``[0, prefix_len)`` at PREPARE, protected by
            ``handle`` until publish or abort: publish inserts exactly these, never a new match.
        handle: the reservation's own lock on the device prefix (not any member's).
        transfers: per component, its prepared transfer (None where it takes no part).
        swa_evicted_seqlen: set by SWA's PREPARE: tokens below which the load holds no SWA.
    """

    lookup: Lookup
    device_slots: torch.Tensor
    handle: Any
    transfers: list[PoolTransfer | None] = field(default_factory=list)
    swa_evicted_seqlen: int = 0

    @property
    def prefix_len(self) -> int:
        return self.lookup.prefix_len

    @property
    def full(self) -> PoolTransfer | None:
        return self.transfers[0] if self.transfers else None


def lock_device_prefix(cache: Any, lookup: Lookup) -> tuple[Any, torch.Tensor] | None:
    """Lock the lookup's device prefix and check it is still exactly servable (its window and
    state too): the lock and the tree's slots there, or None (evicted or shortened since the
    match: the lookup is stale and nothing is held)."""
    try:
        handle = cache.lock(lookup.last_node)
    except ValueError:
        return None
    now = cache.peek_prefix(lookup.tokens[: lookup.prefix_len], namespace=lookup.namespace)
    if now.prefix_len != lookup.prefix_len:
        cache.unlock(handle)
        return None
    return handle, now.device_indices.clone()


def reserve(cache: Any, lookup: Lookup, device_slots: torch.Tensor) -> Reservation | None:
    """A reservation for ``lookup``: its own lock on the (already locked, checked) device
    prefix, then LOAD + PREPARE on every component; None, holding nothing, on a refusal."""
    reservation = Reservation(lookup=lookup, device_slots=device_slots,
                              handle=cache.lock(lookup.last_node))
    if prepare(cache.components, reservation):
        return reservation
    cache.unlock(reservation.handle)
    return None


def release(cache: Any, reservation: Reservation) -> None:
    """ABORT what PREPARE took and drop the reservation's lock."""
    abort(cache.components, reservation)
    cache.unlock(reservation.handle)


def prepare(components: Sequence[Any], reservation: Reservation) -> bool:
    """LOAD + PREPARE on every taking-part component (``reservation.transfers`` gets one entry
    per component); on a refusal ABORT the prepared ones in reverse order and return False."""
    keys, prefix = reservation.lookup.keys, reservation.prefix_len
    full: PoolTransfer | None = None
    for component in components:
        if not component.takes_part_in_loads:
            reservation.transfers.append(None)
            continue
        transfer = component.build_external_linker_transfer(LinkerTransferPhase.LOAD, None, keys)
        if transfer is not None:
            full = transfer if full is None else full
            transfer = component.update_external_linker_load(_PREPARE, reservation, full,
                                                             transfer, prefix)
        reservation.transfers.append(transfer)
        if transfer is None:
            abort(components, reservation)
            return False
    return full is not None


def abort(components: Sequence[Any], reservation: Reservation) -> None:
    """ABORT every prepared transfer, last component first; frees what PREPARE reserved."""
    full = reservation.full
    for component, transfer in reversed(list(zip(components, reservation.transfers))):
        if transfer is not None:
            component.update_external_linker_load(_ABORT, reservation, full, transfer,
                                                  reservation.prefix_len)
    reservation.transfers = []


def publish(cache: Any, components: Sequence[Any], reservation: Reservation) -> InsertResult:
    """Insert the locked device prefix plus the verified loaded slots (tracking adoption, not
    a hit, no linker callback), then COMMIT every component to what the tree adopted, and
    check the tree now serves every loaded token (the restored length is the loaded length).

    Raises:
        ShortRestore: the tree serves less than ``len(lookup.tokens)`` after the publish (the
            reservation is then empty: ``release`` only unlocks); logged.
        ValueError: the insert refused (nothing changed); the caller ABORTs.
    """
    lookup, prefix, full = reservation.lookup, reservation.prefix_len, reservation.full
    assert full is not None and full.device_indices is not None, "publish of a load w/o FULL"
    value = torch.cat([reservation.device_slots, full.device_indices])
    assert value.shape[0] == len(lookup.tokens) and reservation.device_slots.shape[0] == prefix, (
        f"publish of {value.shape[0]} slots for {len(lookup.tokens)} tokens "
        f"(device prefix {reservation.device_slots.shape[0]} of {prefix})"
    )
    mamba = next((t.device_indices for t in reservation.transfers
                  if t is not None and t.name is PoolName.MAMBA), None)
    params = InsertParams(
        key=lookup.tokens,
        value=value,
        prev_prefix_len=prefix,
        swa_evicted_seqlen=reservation.swa_evicted_seqlen,
        mamba_value=None if mamba is None else int(mamba.reshape(-1)[0]),
        track_adopted_ranges=True,
        namespace=lookup.namespace,
    )
    result: InsertResult = cache.insert_loaded(params)
    for component, transfer in zip(components, reservation.transfers):
        if transfer is not None:
            component.update_external_linker_load(_COMMIT, reservation, full, transfer, prefix,
                                                  insert_result=result)
    served = cache.peek_prefix(lookup.tokens, namespace=lookup.namespace).prefix_len
    if served < len(lookup.tokens):
        reservation.transfers = []  # NOTE: the insert adopted or freed every reserved slot
        message = (f"restored {served} of {len(lookup.tokens)} tokens after publishing a load "
                   f"of {len(lookup.tokens) - prefix} (a component published less than it "
                   "loaded: a short SWA window or a missing state)")
        logger.warning("load failure: %s", message)
        raise ShortRestore(message)
    return result
