"""The SWA side of the external cache linker: export a node's trailing window pages, reserve and
map SWA pages for a load's window, release them on ABORT (DESIGN.md sections 5 and 5b).

Owns no state; works on an ``SWAComponent`` through its allocator and held count. Must not
touch the full pool's slots except to map SWA pages to (or unmap them from) a load's reserved
full pages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from radixlink.contract import (
    ComponentType,
    ExternalLinkerLoadPhase,
    InsertResult,
    LinkerTransferPhase,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from radixlink.tree.node import TreeNode

if TYPE_CHECKING:
    from radixlink.components.swa import SWAComponent

_TRAILING = PoolHitPolicy.TRAILING_PAGES


def build_transfer(
    comp: SWAComponent, phase: LinkerTransferPhase, node: TreeNode | None, keys: list[str]
) -> PoolTransfer | None:
    """``SWAComponent.build_external_linker_transfer``.

    OFFLOAD: the live SWA slots of ``node``'s last ``window_pages`` pages, keyed by their
    hashes (None without hashes or live SWA there). LOOKUP: every tail key, trailing policy.
    LOAD: ``min(window_pages, len(keys))`` fresh SWA pages for the tail's last pages, evicting
    SWA when short (None when even that cannot make room); held until COMMIT/ABORT."""
    ps = comp.page_size
    if phase is LinkerTransferPhase.OFFLOAD:
        if node is None or node.hash_value is None:
            return None
        value = node.values[comp.index]
        num = 0 if value is None else min(comp.window_pages, value.shape[0] // ps)
        if num == 0 or value is None:
            return None
        return PoolTransfer(name=PoolName.SWA, keys=list(node.hash_value[-num:]),
                            device_indices=value[value.shape[0] - num * ps :],
                            hit_policy=_TRAILING)
    if phase is LinkerTransferPhase.LOOKUP:
        return PoolTransfer(name=PoolName.SWA, keys=list(keys), hit_policy=_TRAILING)
    num = min(comp.window_pages, len(keys))
    if num == 0:
        return None
    slots = _alloc_swa(comp, num * ps)
    if slots is None:
        return None
    return PoolTransfer(name=PoolName.SWA, keys=list(keys[-num:]), device_indices=slots,
                        hit_policy=_TRAILING)


def _alloc_swa(comp: SWAComponent, num_tokens: int) -> torch.Tensor | None:
    alloc = comp.allocator
    slots = alloc.alloc_swa(num_tokens)
    if slots is None:
        tree = comp.tree
        targets = [0] * tree.num_components
        targets[comp.index] = num_tokens - alloc.swa_available_size()
        effects = tree.evict(targets)
        for component in reversed(tree.components):
            component.apply(effects)  # type: ignore[attr-defined]
        slots = alloc.alloc_swa(num_tokens)
    if slots is not None:
        comp.num_held += slots.shape[0]
    return slots


def update_load(
    comp: SWAComponent,
    phase: ExternalLinkerLoadPhase,
    req: Any,
    full_transfer: PoolTransfer | None,
    transfer: PoolTransfer | None,
    prefix_len: int,
    *,
    insert_result: InsertResult | None = None,
    canonical_full: torch.Tensor | None = None,
) -> PoolTransfer | None:
    """``SWAComponent.update_external_linker_load``.

    PREPARE: map the tail's last full pages to the reserved SWA pages and raise
    ``req.swa_evicted_seqlen`` to where they start (the insert keeps only those). COMMIT: the
    insert already kept, healed with or dropped every mapped page (exactly once); return the
    transfer trimmed to the adopted pages, with their canonical SWA slots. ABORT: free the
    reserved SWA pages and their mappings."""
    if transfer is None or transfer.device_indices is None:
        return transfer
    swa = transfer.device_indices
    assert full_transfer is not None and full_transfer.device_indices is not None, (
        "an SWA load without FULL slots"
    )
    full = full_transfer.device_indices
    tail = full[full.shape[0] - swa.shape[0] :]
    alloc = comp.allocator
    if phase is ExternalLinkerLoadPhase.PREPARE:
        alloc.set_full_to_swa_mapping(tail, swa)
        start = prefix_len + full.shape[0] - swa.shape[0]
        req.swa_evicted_seqlen = max(int(getattr(req, "swa_evicted_seqlen", 0)), start)
        return transfer
    if phase is ExternalLinkerLoadPhase.ABORT:
        if torch.equal(alloc.translate_full_to_swa(tail), swa):
            alloc.free_swa(tail)
        else:  # NOTE: reserved but never mapped
            alloc.swa.free(swa)
        comp.num_held -= swa.shape[0]
        return None
    assert insert_result is not None, "COMMIT needs the insert's result"
    return _adopted(comp, transfer, insert_result, prefix_len + full.shape[0])


def _adopted(
    comp: SWAComponent, transfer: PoolTransfer, result: InsertResult, end: int
) -> PoolTransfer:
    """The part of ``transfer`` the tree took, as the tree's SWA slots now hold it."""
    ps, swa = comp.page_size, transfer.device_indices
    assert swa is not None
    start = end - swa.shape[0]
    keys: list[str] = []
    parts: list[torch.Tensor] = []
    for a, b in result.adopted_ranges.get(ComponentType.SWA, ()):
        lo, hi = max(a, start), min(b, end)
        if hi > lo:
            keys.extend(transfer.keys[(lo - start) // ps : (hi - start) // ps])
            parts.append(_tree_swa(comp, result.last_node, lo, hi))
    slots = torch.cat(parts) if parts else swa[:0]
    return PoolTransfer(name=PoolName.SWA, keys=keys, device_indices=slots,
                        hit_policy=_TRAILING)


def _tree_swa(comp: SWAComponent, node: TreeNode, lo: int, hi: int) -> torch.Tensor:
    """The tree's SWA slots for tokens ``[lo, hi)`` on the path ending at ``node``."""
    parts: list[torch.Tensor] = []
    while node.parent is not None and node.seq_len > lo:
        start = node.seq_len - (len(node.key) >> 2)
        a, b = max(lo, start), min(hi, node.seq_len)
        full = node.values[0]
        if b > a and full is not None:
            parts.append(comp.allocator.translate_full_to_swa(full[a - start : b - start]))
        node = node.parent
    parts.reverse()
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
