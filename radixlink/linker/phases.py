"""The component side of one load, as typed steps over a ``Reservation``: ``prepare`` (reserve
and map slots, lock the device prefix), ``abort`` (release them, in reverse order) and
``publish`` (insert the verified pages after exactly the locked prefix, then COMMIT).

Each component's part is its typed ``ComponentLoad`` (``prepare_load`` returns it,
``commit_load`` / ``abort_load`` take it back; the DESIGN.md hooks are adapters over these).
Owns no state; runs on the caller's thread. Must not touch stores or threads.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from radixlink.components.base import ComponentLoad
from radixlink.contract import InsertParams, InsertResult, MatchResult, PoolName, PoolTransfer
from radixlink.linker.lookup import Lookup

logger = logging.getLogger(__name__)


class ShortRestore(ValueError):
    """The publish restored less than the load brought (a component published a short window
    or no state): the load fails, loudly. The insert already took every reserved slot, so
    there is nothing left to ABORT."""


@dataclass(slots=True, kw_only=True)
class Reservation:
    """What PREPARE took for one transfer, and what publish will insert.

    ::

        tokens     |------ device prefix (locked) ------|------- loaded tail -------|
        slots      |  device_slots: the tree's own      |  loads[0] (FULL)         |
                   0                               prefix_len                  len(tokens)

    Attributes:
        lookup: the lookup this load serves (tokens, keys, namespace).
        device_slots: the tree's full slots of ``[0, prefix_len)`` at PREPARE, protected by
            ``handle`` until publish or abort: publish inserts exactly these, never a new match.
        handle: the reservation's own lock on the device prefix (not any member's).
        loads: per component, its ``ComponentLoad`` (None where it takes no part); emptied by
            ABORT, or by a short publish (the insert took every reserved slot then).
        transfers: per component, the transfer its load lands in (``loads``' transfers, None
            where it takes no part): what the worker fills and the stored marks cover.
        swa_evicted_seqlen: set by SWA's PREPARE: tokens below which the load holds no SWA.
    """

    lookup: Lookup
    device_slots: torch.Tensor
    handle: Any
    loads: list[ComponentLoad | None] = field(default_factory=list)
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
    now = cache.match_prefix(lookup.tokens[: lookup.prefix_len], namespace=lookup.namespace,
                             touch=False)
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
    """LOAD + PREPARE on every taking-part component, backbone first (``reservation.loads``
    gets one entry per component); on a refusal ABORT the prepared ones in reverse order and
    return False."""
    keys = reservation.lookup.keys
    for component in components:
        load = None
        if component.takes_part_in_loads:
            load = component.prepare_load(keys, reservation)
            if load is None:
                abort(components, reservation)
                return False
        reservation.loads.append(load)
        reservation.transfers.append(None if load is None else load.transfer)
    return reservation.full is not None


def abort(components: Sequence[Any], reservation: Reservation) -> None:
    """ABORT every prepared load, last component first; frees what PREPARE reserved."""
    for component, load in reversed(list(zip(components, reservation.loads))):
        if load is not None:
            component.abort_load(load)
    reservation.loads, reservation.transfers = [], []


def publish(cache: Any, components: Sequence[Any], reservation: Reservation) -> MatchResult:
    """Insert the locked device prefix plus the verified loaded slots (tracking adoption, not
    a hit, no linker callback: the lookup's page keys go with it), then COMMIT every
    component, and check the tree now serves every loaded token (the restored length is the
    loaded length). Returns that read-only match of the restored prefix.

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
    mamba = None
    for t in reservation.transfers:
        if t is not None and t.name is PoolName.MAMBA:
            mamba = t.device_indices
    params = InsertParams(
        key=lookup.tokens,
        value=value,
        prev_prefix_len=prefix,
        swa_evicted_seqlen=reservation.swa_evicted_seqlen,
        mamba_value=None if mamba is None else int(mamba.reshape(-1)[0]),
        track_adopted_ranges=True,
        namespace=lookup.namespace,
    )
    # NOTE: the lookup's page keys, chained from the device prefix: the insert never calls
    # the linker back for them.
    result: InsertResult = cache.insert_loaded(
        params, page_hashes=(prefix // cache.page_size, lookup.keys))
    for component, load in zip(components, reservation.loads):
        if load is not None:
            component.commit_load(load, result)
    match: MatchResult = cache.match_prefix(lookup.tokens, namespace=lookup.namespace,
                                            touch=False)
    served = match.prefix_len
    if served < len(lookup.tokens):
        reservation.loads, reservation.transfers = [], []  # NOTE: the insert took every slot
        message = (f"restored {served} of {len(lookup.tokens)} tokens after publishing a load "
                   f"of {len(lookup.tokens) - prefix} (a component published less than it "
                   "loaded: a short SWA window or a missing state)")
        logger.warning("load failure: %s", message)
        raise ShortRestore(message)
    return match
