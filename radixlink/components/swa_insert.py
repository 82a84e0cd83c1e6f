"""What an insert does to SWA data: keep the caller's live window, heal tombstones, drop the rest.

Owns the per-insert SWA decisions (as ``Effects`` records), the SWA counters they change, and the
remap that applies a heal on a locked node. Must not walk or reshape the tree; reaches the SWA
component only through the explicit inputs of ``SWAInsert``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from radixlink.contract import ComponentType
from radixlink.memory.pools import KVPool
from radixlink.memory.swa_allocator import SWAAllocator
from radixlink.tree.node import InsertContext, TreeNode

_SWA, _FULL = ComponentType.SWA, ComponentType.FULL


@dataclass(slots=True)
class SWACounts:
    """The SWA pool's tokens cached by the tree and held by requests (shared by the SWA
    component and its insert / linker units)."""

    cached_tokens: int = 0
    num_held: int = 0


@dataclass(slots=True)
class Remap:
    """Heal a locked node: map its (tree-owned) full pages to the caller's SWA pages."""

    node: TreeNode
    tree_full: torch.Tensor
    caller_full: torch.Tensor
    swa: torch.Tensor


class SWAInsert:
    """The SWA rules of one insert, as methods over explicit inputs.

    Args:
        allocator: the hybrid allocator (full pages, SWA pages and the mapping).
        index: the SWA component's slot in ``node.values``.
        counts: the SWA counters this unit changes.
        refresh: re-decide a node's SWA evictable membership after its data changed.
        pool: the SWA ``KVPool`` (moves data only if a remap gets other pages), or None.
    """

    def __init__(self, allocator: SWAAllocator, index: int, counts: SWACounts,
                 refresh: Callable[[TreeNode], None], pool: KVPool | None):
        self.allocator = allocator
        self.page_size = allocator.page_size
        self.index = index
        self.counts = counts
        self.refresh = refresh
        self.pool = pool

    def insert_node(self, ctx: InsertContext, node: TreeNode, start: int, end: int) -> None:
        """The key covers existing ``node`` (tokens ``[start, end)``): heal the dead SWA tokens
        the caller has live, drop the rest of the caller's SWA pages there.

        ::

            node      |== tree's own ==|------------ caller's duplicates -------------|
            caller    0          prev  |  dead SWA  |  live SWA (from live_start) ... |
            node SWA  |           dead (tombstone)             |        live        |
                                                    |<- heal ->|
                                                heal_start  node_live             end
        """
        low = max(start, ctx.prev_prefix_len)
        if low >= end:
            return
        adopted = ctx.backbone_adopted
        if adopted and adopted[-1] == (start, end):  # FULL just unevicted it with the caller's
            self.keep_caller(ctx, node, start, end)
            return
        live_start, _ = self.caller_live(ctx)
        heal_start = max(low, live_start)
        value = node.values[self.index]
        node_live = end if value is None else end - value.shape[0]
        if heal_start >= node_live:
            self.drop(ctx, low, end)
            return
        self.drop(ctx, low, heal_start)
        self.drop(ctx, node_live, end)
        self._heal(ctx, node, heal_start, node_live)

    def _heal(self, ctx: InsertContext, node: TreeNode, a: int, b: int) -> None:
        """Tokens ``[a, b)`` of ``node`` are dead SWA in the tree and live in the caller's slots.
        An unlocked node takes the caller's full pages with their SWA (adopted FULL and SWA
        ranges); a locked node keeps its full pages and gets the caller's SWA pages mapped."""
        i, start = self.index, node.seq_len - (len(node.key) >> 2)
        caller = ctx.value[a:b]
        swa = self.allocator.translate_full_to_swa(caller)
        full = node.values[0]
        if node.lock_refs[0] == 0:
            fresh = caller.clone()
            ctx.effects.freed[0].append(full[a - start : b - start])
            node.values[0] = torch.cat([full[: a - start], fresh, full[b - start :]])
            ctx.adopt(0, _FULL, a, b, fresh)
            ctx.adopt(i, _SWA, a, b, b - a)
        else:  # NOTE: requests read the locked full slots; never replace them
            ctx.adopt(i, _SWA, a, b, Remap(node, full[a - start : b - start], caller, swa))
        value = node.values[i]
        node.values[i] = swa if value is None else torch.cat([swa, value])
        self.counts.cached_tokens += b - a
        self.refresh(node)

    def keep_caller(self, ctx: InsertContext, node: TreeNode, start: int, end: int) -> None:
        """``node``'s full value is the caller's ``[start, end)`` (new leaf or unevict): keep the
        caller's live SWA suffix on it and drop the caller's SWA pages below."""
        live_start, _ = self.caller_live(ctx)
        low = max(start, live_start)
        self.drop(ctx, start, min(low, end))
        if low < end:
            full = node.values[0]
            node.values[self.index] = self.allocator.translate_full_to_swa(full[low - start :])
            self.counts.cached_tokens += end - low
            ctx.adopt(self.index, _SWA, low, end, end - low)
            self.refresh(node)

    def caller_live(self, ctx: InsertContext) -> tuple[int, np.ndarray]:
        """Where the caller's live SWA starts (every page from there to ``aligned_len`` is mapped
        and at or above ``swa_evicted_seqlen``), and which of its pages from ``prev_prefix_len``
        are mapped. Computed once per insert."""
        note = ctx.notes[self.index]
        if note is None:
            ps, prev, end = self.page_size, ctx.prev_prefix_len, ctx.aligned_len
            mapped = self.allocator.mapped(ctx.value[prev:end:ps])
            live = max(prev, -(-ctx.params.swa_evicted_seqlen // ps) * ps)
            holes = np.flatnonzero(~mapped)
            if holes.size:
                live = max(live, prev + (int(holes[-1]) + 1) * ps)
            note = ctx.notes[self.index] = (min(live, end), mapped)
        return note

    def drop(self, ctx: InsertContext, a: int, b: int) -> None:
        """The caller's SWA pages mapped to its full slots ``[a, b)`` go back to the pool."""
        if a >= b:
            return
        _, mapped = self.caller_live(ctx)
        ps, prev = self.page_size, ctx.prev_prefix_len
        num = int(np.count_nonzero(mapped[(a - prev) // ps : (b - prev) // ps])) * ps
        if num:
            ctx.effects.dropped[self.index].append((ctx.value[a:b], num))

    def remap(self, record: Remap) -> None:
        """Apply a ``Remap``: move the caller's SWA pages from its full pages to the node's."""
        alloc = self.allocator
        alloc.free_swa(record.caller_full)
        fresh = alloc.alloc_swa(record.swa.shape[0])
        assert fresh is not None, "the SWA pages just freed cannot be taken again"
        if not torch.equal(fresh, record.swa):
            # NOTE: only if the allocator hands back other pages than the ones just freed.
            if self.pool is not None:
                self.pool.write_pages(fresh, self.pool.read_pages(record.swa))
            record.node.values[self.index][: fresh.shape[0]] = fresh
        alloc.set_full_to_swa_mapping(record.tree_full, fresh)
