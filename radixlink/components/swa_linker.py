"""The SWA side of the external cache linker: export a node's trailing window pages, reserve and
map SWA pages for a load's window, release them on ABORT (DESIGN.md sections 5 and 5b).

Owns no state of its own; ``SWALinker`` works through explicit inputs (the allocator, the SWA
counters, the facade's eviction path). Must not touch the full pool's slots except to map SWA
pages to (or unmap them from) a load's reserved full pages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from radixlink.components.base import alloc_or_evict
from radixlink.components.swa_insert import SWACounts
from radixlink.contract import (
    ExternalLinkerLoadPhase,
    LinkerTransferPhase,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from radixlink.memory.swa_allocator import SWAAllocator
from radixlink.tree.node import TreeNode

_TRAILING = PoolHitPolicy.TRAILING_PAGES


class SWALinker:
    """The SWA linker hooks over explicit inputs.

    Args:
        allocator: the hybrid allocator.
        window_pages: ``ceil(window / page_size)``.
        index: the SWA component's slot in ``node.values``.
        counts: the SWA counters (reserved pages count as held).
        make_room: the facade's eviction path for SWA tokens.
    """

    def __init__(self, allocator: SWAAllocator, window_pages: int, index: int,
                 counts: SWACounts, make_room: Callable[[int], None]):
        self.allocator = allocator
        self.page_size = allocator.page_size
        self.window_pages = window_pages
        self.index = index
        self.counts = counts
        self.make_room = make_room


    def build_transfer(
        self, phase: LinkerTransferPhase, node: TreeNode | None, keys: list[str]
    ) -> PoolTransfer | None:
        """OFFLOAD: the live SWA slots of ``node``'s last ``window_pages`` pages, keyed by their
        hashes (None without hashes or live SWA there). LOOKUP: every tail key, trailing policy.
        LOAD: ``min(window_pages, len(keys))`` fresh SWA pages for the tail's last pages, evicting
        SWA when short (None when even that cannot make room); held until COMMIT/ABORT."""
        ps = self.page_size
        if phase is LinkerTransferPhase.OFFLOAD:
            if node is None or node.hash_value is None:
                return None
            value = node.values[self.index]
            num = 0 if value is None else min(self.window_pages, value.shape[0] // ps)
            if num == 0 or value is None:
                return None
            return PoolTransfer(name=PoolName.SWA, keys=list(node.hash_value[-num:]),
                                device_indices=value[value.shape[0] - num * ps :],
                                hit_policy=_TRAILING)
        if phase is LinkerTransferPhase.LOOKUP:
            return PoolTransfer(name=PoolName.SWA, keys=list(keys), hit_policy=_TRAILING)
        num = min(self.window_pages, len(keys))
        if num == 0:
            return None
        slots = self._alloc_swa(num * ps)
        if slots is None:
            return None
        return PoolTransfer(name=PoolName.SWA, keys=list(keys[-num:]), device_indices=slots,
                            hit_policy=_TRAILING)

    def _alloc_swa(self, num_tokens: int) -> torch.Tensor | None:
        alloc = self.allocator
        slots = alloc_or_evict(lambda: alloc.alloc_swa(num_tokens), lambda: self.make_room(
            num_tokens - alloc.swa_available_size()))
        if slots is not None:
            self.counts.num_held += slots.shape[0]
        return slots

    def update_load(
        self,
        phase: ExternalLinkerLoadPhase,
        req: Any,
        full_transfer: PoolTransfer | None,
        transfer: PoolTransfer | None,
        prefix_len: int,
    ) -> PoolTransfer | None:
        """PREPARE: map the tail's last full pages to the reserved SWA pages and raise
        ``req.swa_evicted_seqlen`` to where they start (the insert keeps only those). COMMIT:
        nothing (the insert already kept, healed with or dropped every mapped page, exactly
        once). ABORT: free the reserved SWA pages and their mappings."""
        if transfer is None or transfer.device_indices is None:
            return transfer
        swa = transfer.device_indices
        assert full_transfer is not None and full_transfer.device_indices is not None, (
            "an SWA load without FULL slots"
        )
        full = full_transfer.device_indices
        tail = full[full.shape[0] - swa.shape[0] :]
        alloc = self.allocator
        if phase is ExternalLinkerLoadPhase.PREPARE:
            alloc.set_full_to_swa_mapping(tail, swa)
            start = prefix_len + full.shape[0] - swa.shape[0]
            req.swa_evicted_seqlen = max(req.swa_evicted_seqlen, start)
            return transfer
        if phase is ExternalLinkerLoadPhase.ABORT:
            if torch.equal(alloc.translate_full_to_swa(tail), swa):
                alloc.free_swa(tail)
            else:  # NOTE: reserved but never mapped
                alloc.swa.free(swa)
            self.counts.num_held -= swa.shape[0]
            return None
        return transfer  # COMMIT: the insert kept, healed with or dropped every mapped page
