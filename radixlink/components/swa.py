"""``SWAComponent``: sliding-window attention K/V on the tree, linked to full slots.

Owns the SWA side of the tree: each node's live SWA suffix, window locks, the SWA evictable set
and the SWA pool's held count. Reaches the full->SWA mapping only through ``SWAAllocator``;
frees full slots only by asking the tree to remove a leaf (or, healing, through ``Effects``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from radixlink.components.base import ComponentLoad
from radixlink.components.side import SideComponent
from radixlink.components.swa_insert import Remap, SWACounts, SWAInsert
from radixlink.components.swa_linker import SWALinker
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

_SWA = ComponentType.SWA


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
        self.counts = SWACounts()
        self._empty = torch.empty(0, dtype=torch.int64, device=allocator.device)

    def bind(self, tree: Any, index: int) -> None:
        super().bind(tree, index)
        self._insert = SWAInsert(self.allocator, index, self.counts, self.refresh, self.pool)
        self._linker = SWALinker(self.allocator, self.window, index, self.counts,
                                 self._make_room)

    @property
    def cached_tokens(self) -> int:
        return self.counts.cached_tokens

    @property
    def num_held(self) -> int:
        return self.counts.num_held

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
        self.counts.cached_tokens -= units

    def _cached(self) -> int:
        return self.counts.cached_tokens

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

    # ---------------------------------------------------------------- insert (swa_insert.py)

    def insert_leaf(self, ctx: InsertContext, node: TreeNode) -> None:
        self._insert.keep_caller(ctx, node, node.seq_len - (len(node.key) >> 2), node.seq_len)

    def insert_overlap(self, ctx: InsertContext, node: TreeNode, start: int, end: int) -> None:
        self._insert.insert_node(ctx, node, start, end)

    def insert_unevict(self, ctx: InsertContext, node: TreeNode, start: int, end: int) -> None:
        self._insert.insert_node(ctx, node, start, end)

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
                self._insert.remap(record)
                self.counts.num_held -= record.swa.shape[0]
            else:
                self.counts.num_held -= record
        dropped = effects.dropped[i]
        if dropped:
            # NOTE: whole pages known good (the tree's, or the caller's checked by insert):
            # the trusted frees skip the validation, as FullComponent.apply's do
            alloc.free_swa_trusted(torch.cat([slots for slots, _ in dropped]))
            self.counts.num_held -= sum(num for _, num in dropped)
        freed = effects.freed[i]
        if freed:
            alloc.free_swa_trusted(freed[0] if len(freed) == 1 else torch.cat(freed))

    def alloc_mapped(self, num_tokens: int) -> torch.Tensor | None:
        """Facade (``alloc``): full slots (whole pages) each mapped to a fresh SWA page, or None
        when either pool is short; the SWA pages count as held. ``FullComponent.alloc``'s
        source."""
        slots = self.allocator.alloc(num_tokens)
        if slots is not None:
            self.counts.num_held += slots.shape[0]
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
        self.counts.num_held -= num

    def free_held(self, full_slots: torch.Tensor) -> None:
        """Free the SWA pages mapped to the caller's ``full_slots`` (whole pages; the caller
        checked that the tree does not own them). Unmapped pages are skipped."""
        num = self._count_mapped(full_slots)
        self.allocator.free_swa(full_slots)
        self.counts.num_held -= num

    def stats(self) -> dict[str, Any]:
        return {
            "swa_window": self.window.tokens,
            "swa_cached_tokens": self.cached_tokens,
            "swa_held_tokens": self.num_held,
            "swa_free_tokens": self.allocator.swa_available_size(),
            "swa_evictable_nodes": len(self.evictable),
        }

    # ---------------------------------------------------------------- linker (swa_linker.py)

    def _offload_transfer(self, node: TreeNode) -> PoolTransfer | None:
        return self._linker.offload_transfer(node)

    def _reserve_load(self, keys: list[str]) -> PoolTransfer | None:
        return self._linker.reserve(keys)

    def _map_load(self, load: ComponentLoad) -> dict[str, Any]:
        return self._linker.map(load)

    def abort_load(self, load: ComponentLoad) -> None:
        self._linker.release(load)
