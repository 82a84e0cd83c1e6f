"""The component side of one load: PREPARE (reserve slots), ABORT (release them, in reverse
order) and publish (insert the verified pages, then COMMIT) through the ``TreeComponent`` hooks.

Owns no state; the linker calls these on the caller's thread. Must not touch stores or threads.
"""

from __future__ import annotations

from collections.abc import Sequence
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
from radixlink.linker.records import Load

_PREPARE, _COMMIT, _ABORT = (
    ExternalLinkerLoadPhase.PREPARE,
    ExternalLinkerLoadPhase.COMMIT,
    ExternalLinkerLoadPhase.ABORT,
)


def prepare(components: Sequence[Any], load: Load) -> bool:
    """LOAD + PREPARE on every taking-part component (``load.transfers`` gets one entry per
    component, None where it takes no part); on a refusal ABORT the prepared ones in reverse
    order and return False."""
    keys, prefix = load.lookup.keys, load.lookup.prefix_len
    full: PoolTransfer | None = None
    for component in components:
        transfer = component.build_external_linker_transfer(LinkerTransferPhase.LOAD, None, keys)
        if transfer is not None:
            if full is None:
                full = transfer
            transfer = component.update_external_linker_load(_PREPARE, load, full, transfer,
                                                             prefix)
        if transfer is None and component.build_external_linker_transfer(
                LinkerTransferPhase.LOOKUP, None, keys) is not None:
            abort(components, load)
            return False
        load.transfers.append(transfer)
    return full is not None


def abort(components: Sequence[Any], load: Load) -> None:
    """ABORT every prepared transfer of ``load``, last component first; frees what PREPARE
    reserved."""
    full = load.transfers[0] if load.transfers else None
    for component, transfer in reversed(list(zip(components, load.transfers))):
        if transfer is not None:
            component.update_external_linker_load(_ABORT, load, full, transfer,
                                                  load.lookup.prefix_len)
    load.transfers = []


def publish(cache: Any, components: Sequence[Any], load: Load) -> InsertResult:
    """Insert the verified pages of ``load`` after its device prefix (tracking adoption), then
    COMMIT every component to the slots the tree adopted. Returns the insert's result."""
    lookup, prefix = load.lookup, load.lookup.prefix_len
    full = load.transfers[0]
    assert full is not None and full.device_indices is not None, "a load without FULL"
    device = cache.match_prefix(lookup.tokens[:prefix], namespace=lookup.namespace)
    mamba = next((t.device_indices for t in load.transfers
                  if t is not None and t.name is PoolName.MAMBA), None)
    params = InsertParams(
        key=lookup.tokens,
        value=torch.cat([device.device_indices[:prefix], full.device_indices]),
        prev_prefix_len=prefix,
        swa_evicted_seqlen=load.swa_evicted_seqlen,
        mamba_value=None if mamba is None else int(mamba.reshape(-1)[0]),
        track_adopted_ranges=True,
        namespace=lookup.namespace,
    )
    if device.mamba_slot is not None:
        cache.free_state(device.mamba_slot)
    result: InsertResult = cache.insert(params)
    for component, transfer in zip(components, load.transfers):
        if transfer is not None:
            component.update_external_linker_load(_COMMIT, load, full, transfer, prefix,
                                                  insert_result=result, canonical_full=None)
    return result
