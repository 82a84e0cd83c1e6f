"""The SWA side of the external cache linker: export a node's trailing window pages, reserve and
map SWA pages for a load's window, release them on ABORT (DESIGN.md sections 5 and 5b).

Owns no state of its own; ``SWALinker`` works through explicit inputs (the allocator, the
window, the SWA counters, the facade's eviction path). Must not touch the full pool's slots
except to map SWA pages to (or unmap them from) a load's reserved full pages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from radixlink.components.base import ComponentLoad, alloc_or_evict
from radixlink.components.swa_insert import SWACounts
from radixlink.components.window import Window
from radixlink.contract import PoolHitPolicy, PoolName, PoolTransfer
from radixlink.memory.swa_allocator import SWAAllocator
from radixlink.tree.node import TreeNode

_TRAILING = PoolHitPolicy.TRAILING_PAGES


class SWALinker:
    """The SWA steps of a linker transfer over explicit inputs.

    Args:
        allocator: the hybrid allocator.
        window: the SWA window.
        index: the SWA component's slot in ``node.values``.
        counts: the SWA counters (reserved pages count as held).
        make_room: the facade's eviction path for SWA tokens.
    """

    def __init__(self, allocator: SWAAllocator, window: Window, index: int,
                 counts: SWACounts, make_room: Callable[[int], None]):
        self.allocator = allocator
        self.page_size = allocator.page_size
        self.window = window
        self.index = index
        self.counts = counts
        self.make_room = make_room

    def offload_transfer(self, node: TreeNode) -> PoolTransfer | None:
        """The live SWA slots of ``node``'s last window pages, keyed by their hashes (None
        without hashes or live SWA there)."""
        value, ps = node.values[self.index], self.page_size
        if node.hash_value is None or value is None:
            return None
        num = self.window.trailing(value.shape[0] // ps)
        if num == 0:
            return None
        return PoolTransfer(name=PoolName.SWA, keys=list(node.hash_value[-num:]),
                            device_indices=value[value.shape[0] - num * ps :],
                            hit_policy=_TRAILING)

    def reserve(self, keys: list[str]) -> PoolTransfer | None:
        """Fresh SWA pages for the window's pages of the tail ``keys`` (its last ones),
        evicting SWA when short (None when even that cannot make room); held until the
        publishing insert or ABORT."""
        num = self.window.trailing(len(keys))
        if num == 0:
            return None
        alloc, num_tokens = self.allocator, num * self.page_size
        slots = alloc_or_evict(lambda: self.make_room(
            num_tokens - alloc.swa_available_size()), alloc.alloc_swa, num_tokens)
        if slots is None:
            return None
        self.counts.num_held += slots.shape[0]
        return PoolTransfer(name=PoolName.SWA, keys=list(keys[-num:]), device_indices=slots,
                            hit_policy=_TRAILING)

    def map(self, load: ComponentLoad) -> dict[str, Any]:
        """PREPARE: map the tail's last full pages to the reserved SWA pages; the publishing
        insert takes ``swa_evicted_seqlen`` = where they start (it keeps only those; it then
        keeps, heals with or drops every mapped page, exactly once: COMMIT has nothing to do)."""
        swa, full = load.slots, _full_slots(load)
        self.allocator.set_full_to_swa_mapping(full[full.shape[0] - swa.shape[0] :], swa)
        return {"swa_evicted_seqlen": load.prefix_len + full.shape[0] - swa.shape[0]}

    def release(self, load: ComponentLoad) -> None:
        """ABORT: free the reserved SWA pages and their mappings."""
        swa, full, alloc = load.slots, _full_slots(load), self.allocator
        tail = full[full.shape[0] - swa.shape[0] :]
        if torch.equal(alloc.translate_full_to_swa(tail), swa):
            alloc.free_swa(tail)
        else:  # NOTE: reserved but never mapped (LOAD without PREPARE, through the adapters)
            alloc.swa.free(swa)
        self.counts.num_held -= swa.shape[0]


def _full_slots(load: ComponentLoad) -> torch.Tensor:
    full = load.full.device_indices
    assert full is not None and load.full.name is PoolName.KV, "an SWA load without FULL slots"
    return full
