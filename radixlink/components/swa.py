"""``SWAComponent``: sliding-window attention K/V on the tree, linked to full slots: matching,
what an insert does to SWA data (keep the caller's live window, heal tombstones, drop the
rest), locks, eviction, and its part of a linker transfer (the trailing window).

Owns the SWA side of the tree: each node's live SWA suffix, window locks, the SWA evictable set
and the SWA pool's held count. Reaches the full->SWA mapping only through ``SWAAllocator``;
frees full slots only by asking the tree to remove a leaf (or, healing, through ``Effects``);
touches a load's reserved full slots only to map SWA pages to them. The window rule is
``window.Window``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from radixlink.components.base import ComponentLoad, alloc_or_evict
from radixlink.components.side import SideComponent
from radixlink.components.window import Window
from radixlink.config import EvictionPolicy
from radixlink.contract import (
    ComponentType,
    MatchResult,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from radixlink.memory.pools import KVPool
from radixlink.memory.swa_allocator import SWAAllocator
from radixlink.tree.node import Effects, InsertContext, MatchPath, TreeNode

_SWA, _FULL = ComponentType.SWA, ComponentType.FULL
_TRAILING = PoolHitPolicy.TRAILING_PAGES


@dataclass(slots=True)
class Remap:
    """Heal a locked node: map its (tree-owned) full pages to the caller's SWA pages."""

    node: TreeNode
    tree_full: torch.Tensor
    caller_full: torch.Tensor
    swa: torch.Tensor


class SWAComponent(SideComponent):
    """Sliding-window K/V: a boundary ``p`` is matchable when ``[p - W, p)`` has live SWA data.

    A node's value is the SWA slots of its live *suffix* (None = tombstone), always equal to
    the mapping of the node's full slots there; the dead part's full pages map to nothing::

        node         |<------------------ num_tokens ------------------>|
        full value   | f f f f | f f f f | f f f f | f f f f | f f f f  |
        SWA value                        | s s s s | s s s s | s s s s  |
                     start            live start                  seq_len

    Matching counts live tokens back from a boundary across nodes until a dead token. A lock
    protects only the last window: the locked node and the ancestors reaching ``W - page``
    tokens before its start; the receipt is the start of the topmost, so a split (whose front
    part inherits the lock count) moves the boundary consistently. Eviction tombstones the SWA
    data of internal nodes (full KV stays) and removes leaves whole.

    Args:
        allocator: the hybrid allocator (full pages + SWA pages + the mapping).
        window: the attention window ``W`` in tokens.
        policy: LRU or LFU order of evictable nodes (LRU ties: deepest first).
        pool: the SWA ``KVPool`` (only used to move data if a remap gets other pages).
    """

    component_type = _SWA
    pool_name = PoolName.SWA
    layout_setting = "swa_layout"
    takes_part_in_loads = True
    hit_policy = PoolHitPolicy.TRAILING_PAGES

    def __init__(
        self,
        allocator: SWAAllocator,
        window: int,
        policy: EvictionPolicy | str = EvictionPolicy.LRU,
        pool: KVPool | None = None,
    ) -> None:
        self.window = Window(window, allocator.page_size)  # NOTE: checks ``window`` first
        super().__init__(policy)
        self.window_pages = self.window.pages  # the linker's LOOKUP reads it
        self.allocator = allocator
        self.pool = pool
        self.page_size = allocator.page_size
        self.cached_tokens = 0  # SWA tokens the tree caches
        self.num_held = 0  # SWA tokens mapped to request-held (or a load's reserved) full pages
        self._empty = torch.empty(0, dtype=torch.int64, device=allocator.device)

    # ---------------------------------------------------------------- structure

    def split(self, parent: TreeNode, child: TreeNode) -> None:
        i = self.index
        value = child.values[i]
        if value is not None and child.seq_len - value.shape[0] < parent.seq_len:
            cut = parent.seq_len - (child.seq_len - value.shape[0])  # live tokens in the front
            parent.values[i] = value[:cut].clone()
            child.values[i] = value[cut:].clone()
        # Every lock counted on the child reaches at least its start, so covers the front too.
        parent.lock_refs[i] = child.lock_refs[i]
        self.refresh(parent)

    def _units(self, value: torch.Tensor) -> int:
        return int(value.shape[0])

    def _freed(self, node: TreeNode, value: torch.Tensor) -> torch.Tensor:
        full = node.values[0]
        assert full is not None, f"{node}: SWA data without full data"
        return full[full.shape[0] - value.shape[0] :]

    def _uncache(self, units: int) -> None:
        self.cached_tokens -= units

    def _cached(self) -> int:
        return self.cached_tokens

    # ---------------------------------------------------------------- match

    def match_accept(self, nodes: list[TreeNode], limit: int) -> int:
        i, ps, window = self.index, self.page_size, self.window
        best = 0
        live_run: int | None = 0  # where the live run reaching this node starts; None: dead
        for node in nodes:
            start = node.seq_len - (len(node.key) >> 2)
            if start >= limit:
                break
            value = node.values[i]
            if value is None:
                live_run = None
                continue
            live = node.seq_len - value.shape[0]
            if live > start or live_run is None:
                live_run = live
            low = live + ps
            if live_run > 0:  # a run from token 0 needs no full window
                low = max(low, window.first_boundary(live_run))
            high = min(node.seq_len, limit)
            if high >= low:
                best = high
        return best

    def fill_match(self, result: MatchResult, path: MatchPath) -> None:
        """``swa_indices``: SWA slots of the last ``min(prefix_len, window_pages * page)``
        tokens; ``swa_live_len``: live tokens counted back from ``prefix_len``."""
        end = path.prefix_len
        if end == 0:
            result.swa_indices, result.swa_live_len = self._empty, 0
            return
        i = self.index
        need = self.window.span(end)
        parts: list[torch.Tensor] = []
        live_len = 0
        for node in reversed(path.nodes):
            value = node.values[i]
            if value is None:
                break
            live = node.seq_len - value.shape[0]
            stop = min(node.seq_len, end)
            live_len += stop - live
            if need > 0:
                take = min(need, stop - live)
                parts.append(value[stop - take - live : stop - live])
                need -= take
            if live > node.seq_len - (len(node.key) >> 2):
                break  # the run starts inside this node
        assert need == 0, f"match accepted {end} tokens but the SWA window is not live"
        parts.reverse()
        result.swa_indices = parts[0] if len(parts) == 1 else torch.cat(parts)
        result.swa_live_len = live_len

    # ---------------------------------------------------------------- insert

    def insert_overlap(self, ctx: InsertContext, node: TreeNode, start: int, end: int) -> None:
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
            self.insert_leaf(ctx, node, start, end)
            return
        live_start, _ = self._caller_live(ctx)
        heal_start = max(low, live_start)
        value = node.values[self.index]
        node_live = end if value is None else end - value.shape[0]
        if heal_start >= node_live:
            self._drop(ctx, low, end)
            return
        self._drop(ctx, low, heal_start)
        self._drop(ctx, node_live, end)
        self._heal(ctx, node, heal_start, node_live)

    insert_unevict = insert_overlap  # NOTE: a tombstone heals as a node's dead front does

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
        self.cached_tokens += b - a
        self.refresh(node)

    def insert_leaf(self, ctx: InsertContext, node: TreeNode, start: int, end: int) -> None:
        """``node``'s full value is the caller's ``[start, end)`` (new leaf or unevict): keep the
        caller's live SWA suffix on it and drop the caller's SWA pages below."""
        live_start, _ = self._caller_live(ctx)
        low = max(start, live_start)
        self._drop(ctx, start, min(low, end))
        if low < end:
            full = node.values[0]
            node.values[self.index] = self.allocator.translate_full_to_swa(full[low - start :])
            self.cached_tokens += end - low
            ctx.adopt(self.index, _SWA, low, end, end - low)
            self.refresh(node)

    def _caller_live(self, ctx: InsertContext) -> tuple[int, np.ndarray]:
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

    def _drop(self, ctx: InsertContext, a: int, b: int) -> None:
        """The caller's SWA pages mapped to its full slots ``[a, b)`` go back to the pool."""
        if a >= b:
            return
        _, mapped = self._caller_live(ctx)
        ps, prev = self.page_size, ctx.prev_prefix_len
        num = int(np.count_nonzero(mapped[(a - prev) // ps : (b - prev) // ps])) * ps
        if num:
            ctx.effects.dropped[self.index].append((ctx.value[a:b], num))

    def _remap(self, record: Remap) -> None:
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

    # ---------------------------------------------------------------- locks and eviction

    def lock(self, node: TreeNode) -> int:
        i = self.index
        reach = self.window.lock_reach(node.seq_len - (len(node.key) >> 2))
        top = node.seq_len
        while node.parent is not None and node.seq_len > reach:
            if node.lock_refs[i] == 0:
                self.evictable.discard(node)
            node.lock_refs[i] += 1
            top = node.seq_len - (len(node.key) >> 2)
            node = node.parent
        return top

    def unlock(self, node: TreeNode, receipt: Any) -> None:
        i = self.index
        while node.parent is not None and node.seq_len > receipt:
            assert node.lock_refs[i] > 0, f"SWA unlock below zero at {node}"
            node.lock_refs[i] -= 1
            if node.lock_refs[i] == 0:
                self.refresh(node)
            node = node.parent

    # ---------------------------------------------------------------- checks

    def _check_value(self, node: TreeNode, value: torch.Tensor) -> None:
        num = value.shape[0]
        assert 0 < num <= node.num_tokens and num % self.page_size == 0, (
            f"{node}: SWA suffix of {num} tokens on a {node.num_tokens}-token node"
        )

    def _lock_counts(self, handles: list[Any]) -> dict[int, int]:
        i, expected = self.index, dict[int, int]()
        for handle in handles:
            if not handle.parts:
                continue
            node, receipt = handle.node, handle.parts[i]
            while node.parent is not None and node.seq_len > receipt:
                expected[id(node)] = expected.get(id(node), 0) + 1
                node = node.parent
        return expected

    def check_accounting(self) -> None:
        """Per SWA pool free + cached + held == total, and every node's full slots map to
        exactly its SWA value (live suffix) and to nothing elsewhere."""
        alloc, i = self.allocator, self.index
        free, total = alloc.swa_available_size(), alloc.swa_total_size()
        assert self.num_held >= 0, f"swa: negative held count {self.num_held}"
        assert free + self.cached_tokens + self.num_held == total, (
            f"swa pool: free {free} + cached {self.cached_tokens} + held {self.num_held} "
            f"!= total {total}"
        )
        alloc.check_invariants()
        for node in self.tree.iter_nodes():
            full = node.values[0]
            if full is None:
                continue
            mapped = alloc.translate_full_to_swa(full)
            value = node.values[i]
            num = 0 if value is None else value.shape[0]
            dead = full.shape[0] - num
            assert not bool(mapped[:dead].any()), f"{node}: dead SWA tokens still mapped"
            assert num == 0 or torch.equal(mapped[dead:], value), (
                f"{node}: SWA value differs from the full->SWA mapping"
            )

    # ---------------------------------------------------------------- facade

    def apply(self, effects: Effects) -> None:
        i, alloc = self.index, self.allocator
        for record in effects.adopted[i]:  # remaps first: they free and re-take pages at once
            if isinstance(record, Remap):
                self._remap(record)
                self.num_held -= record.swa.shape[0]
            else:
                self.num_held -= record
        dropped = effects.dropped[i]
        if dropped:
            # NOTE: whole pages known good (the tree's, or the caller's checked by insert):
            # the trusted frees skip the validation, as FullComponent.apply's do
            alloc.free_swa_trusted(torch.cat([slots for slots, _ in dropped]))
            self.num_held -= sum(num for _, num in dropped)
        freed = effects.freed[i]
        if freed:
            alloc.free_swa_trusted(freed[0] if len(freed) == 1 else torch.cat(freed))

    def alloc_mapped(self, num_tokens: int) -> torch.Tensor | None:
        """Facade (``alloc``): full slots (whole pages) each mapped to a fresh SWA page, or None
        when either pool is short; the SWA pages count as held. ``FullComponent.alloc``'s
        source."""
        slots = self.allocator.alloc(num_tokens)
        if slots is not None:
            self.num_held += slots.shape[0]
        return slots

    def _count_mapped(self, full_slots: torch.Tensor) -> int:
        """SWA slots mapped to the whole full pages ``full_slots``."""
        return self.allocator.count_mapped(full_slots[:: self.page_size]) * self.page_size

    def free_with_full(
        self, full_slots: torch.Tensor, free: Callable[[torch.Tensor], None]
    ) -> None:
        """Free the caller's ``full_slots`` with ``free`` (the full side, which frees the SWA
        pages mapped to them too) and stop counting those SWA pages as held."""
        num = self._count_mapped(full_slots)
        free(full_slots)
        self.num_held -= num

    def free_held(self, full_slots: torch.Tensor) -> None:
        """Free the SWA pages mapped to the caller's ``full_slots`` (whole pages; the caller
        checked that the tree does not own them). Unmapped pages are skipped."""
        num = self._count_mapped(full_slots)
        self.allocator.free_swa(full_slots)
        self.num_held -= num

    def stats(self) -> dict[str, Any]:
        return {
            "swa_window": self.window.tokens,
            "swa_cached_tokens": self.cached_tokens,
            "swa_held_tokens": self.num_held,
            "swa_free_tokens": self.allocator.swa_available_size(),
            "swa_evictable_nodes": len(self.evictable),
        }

    # ---------------------------------------------------------------- linker (DESIGN.md 5)

    def _offload_transfer(self, node: TreeNode) -> PoolTransfer | None:
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

    def _reserve_load(self, keys: list[str]) -> PoolTransfer | None:
        """Fresh SWA pages for the window's pages of the tail ``keys`` (its last ones),
        evicting SWA when short (None when even that cannot make room); held until the
        publishing insert or ABORT."""
        num = self.window.trailing(len(keys))
        if num == 0:
            return None
        alloc, num_tokens = self.allocator, num * self.page_size
        slots = alloc_or_evict(lambda: self._make_room(
            num_tokens - alloc.swa_available_size()), alloc.alloc_swa, num_tokens)
        if slots is None:
            return None
        self.num_held += slots.shape[0]
        return PoolTransfer(name=PoolName.SWA, keys=list(keys[-num:]), device_indices=slots,
                            hit_policy=_TRAILING)

    def _map_load(self, load: ComponentLoad) -> dict[str, Any]:
        """PREPARE: map the tail's last full pages to the reserved SWA pages; the publishing
        insert takes ``swa_evicted_seqlen`` = where they start (it keeps only those; it then
        keeps, heals with or drops every mapped page, exactly once: COMMIT has nothing to do)."""
        swa, full = load.slots, _full_slots(load)
        self.allocator.set_full_to_swa_mapping(full[full.shape[0] - swa.shape[0] :], swa)
        return {"swa_evicted_seqlen": load.prefix_len + full.shape[0] - swa.shape[0]}

    def abort_load(self, load: ComponentLoad) -> None:
        """ABORT: free the reserved SWA pages and their mappings."""
        swa, full, alloc = load.slots, _full_slots(load), self.allocator
        tail = full[full.shape[0] - swa.shape[0] :]
        if torch.equal(alloc.translate_full_to_swa(tail), swa):
            alloc.free_swa(tail)
        else:  # NOTE: reserved but never mapped (LOAD without PREPARE, through the adapters)
            alloc.swa.free(swa)
        self.num_held -= swa.shape[0]


def _full_slots(load: ComponentLoad) -> torch.Tensor:
    full = load.full.device_indices
    assert full is not None and load.full.name is PoolName.KV, "an SWA load without FULL slots"
    return full
