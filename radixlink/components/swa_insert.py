"""What an insert does to SWA data: keep the caller's live window, heal tombstones, drop the rest.

Owns the per-insert SWA decisions of ``SWAComponent`` (as ``Effects`` records) and the remap that
applies a heal on a locked node. Must not walk or reshape the tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from radixlink.contract import ComponentType
from radixlink.tree.node import InsertContext, TreeNode

if TYPE_CHECKING:
    from radixlink.components.swa import SWAComponent

_SWA, _FULL = ComponentType.SWA, ComponentType.FULL


@dataclass(slots=True)
class Remap:
    """Heal a locked node: map its (tree-owned) full pages to the caller's SWA pages."""

    node: TreeNode
    tree_full: torch.Tensor
    caller_full: torch.Tensor
    swa: torch.Tensor


def insert_node(
    comp: SWAComponent, ctx: InsertContext, node: TreeNode, start: int, end: int
) -> None:
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
        keep_caller(comp, ctx, node, start, end)
        return
    live_start, _ = caller_live(comp, ctx)
    heal_start = max(low, live_start)
    value = node.values[comp.index]
    node_live = end if value is None else end - value.shape[0]
    if heal_start >= node_live:
        drop(comp, ctx, low, end)
        return
    drop(comp, ctx, low, heal_start)
    drop(comp, ctx, node_live, end)
    _heal(comp, ctx, node, heal_start, node_live)


def _heal(comp: SWAComponent, ctx: InsertContext, node: TreeNode, a: int, b: int) -> None:
    """Tokens ``[a, b)`` of ``node`` are dead SWA in the tree and live in the caller's slots.
    An unlocked node takes the caller's full pages with their SWA (adopted FULL and SWA
    ranges); a locked node keeps its full pages and gets the caller's SWA pages mapped."""
    i, start = comp.index, node.seq_len - (len(node.key) >> 2)
    caller = ctx.value[a:b]
    swa = comp.allocator.translate_full_to_swa(caller)
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
    comp.cached_tokens += b - a
    comp.refresh(node)


def keep_caller(
    comp: SWAComponent, ctx: InsertContext, node: TreeNode, start: int, end: int
) -> None:
    """``node``'s full value is the caller's ``[start, end)`` (new leaf or unevict): keep the
    caller's live SWA suffix on it and drop the caller's SWA pages below."""
    live_start, _ = caller_live(comp, ctx)
    low = max(start, live_start)
    drop(comp, ctx, start, min(low, end))
    if low < end:
        full = node.values[0]
        node.values[comp.index] = comp.allocator.translate_full_to_swa(full[low - start :])
        comp.cached_tokens += end - low
        ctx.adopt(comp.index, _SWA, low, end, end - low)
        comp.refresh(node)


def caller_live(comp: SWAComponent, ctx: InsertContext) -> tuple[int, np.ndarray]:
    """Where the caller's live SWA starts (every page from there to ``aligned_len`` is mapped
    and at or above ``swa_evicted_seqlen``), and which of its pages from ``prev_prefix_len``
    are mapped. Computed once per insert."""
    note = ctx.notes[comp.index]
    if note is None:
        ps, prev, end = comp.page_size, ctx.prev_prefix_len, ctx.aligned_len
        heads = comp.allocator.translate_full_to_swa(ctx.value[prev:end:ps])
        mapped = (heads != 0).cpu().numpy()
        live = max(prev, -(-ctx.params.swa_evicted_seqlen // ps) * ps)
        holes = np.flatnonzero(~mapped)
        if holes.size:
            live = max(live, prev + (int(holes[-1]) + 1) * ps)
        note = ctx.notes[comp.index] = (min(live, end), mapped)
    return note


def drop(comp: SWAComponent, ctx: InsertContext, a: int, b: int) -> None:
    """The caller's SWA pages mapped to its full slots ``[a, b)`` go back to the pool."""
    if a >= b:
        return
    _, mapped = caller_live(comp, ctx)
    ps, prev = comp.page_size, ctx.prev_prefix_len
    num = int(mapped[(a - prev) // ps : (b - prev) // ps].sum()) * ps
    if num:
        ctx.effects.dropped[comp.index].append((ctx.value[a:b], num))


def remap(comp: SWAComponent, record: Remap) -> None:
    """Apply a ``Remap``: move the caller's SWA pages from its full pages to the node's."""
    alloc = comp.allocator
    alloc.free_swa(record.caller_full)
    fresh = alloc.alloc_swa(record.swa.shape[0])
    assert fresh is not None, "the SWA pages just freed cannot be taken again"
    if not torch.equal(fresh, record.swa):
        # NOTE: only if the allocator hands back other pages than the ones just freed.
        if comp.pool is not None:
            comp.pool.write_pages(fresh, comp.pool.read_pages(record.swa))
        record.node.values[comp.index][: fresh.shape[0]] = fresh
    alloc.set_full_to_swa_mapping(record.tree_full, fresh)
