"""``MambaComponent``: one recurrent-state slot per node, valid only at the node's end.

Owns the MAMBA side of the tree: node states, state locks, the state evictable set, which slots
the tree owns and the held-by-requests count. Copies state bytes only through
``MambaStatePool.copy`` (copy-on-write at match); never touches K/V pools.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from radixlink.components.base import ComponentLoad, alloc_or_evict
from radixlink.components.side import SideComponent
from radixlink.config import EvictionPolicy
from radixlink.contract import (
    ComponentType,
    MatchResult,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from radixlink.memory.pools import MambaStatePool
from radixlink.memory.states import StateSlots
from radixlink.tree.node import Effects, InsertContext, MatchPath, TreeNode

_MAMBA = ComponentType.MAMBA


class MambaComponent(SideComponent):
    """Recurrent state at node ends: a boundary is matchable only where a node ends with one.

    ``values[i]`` is the tree's state slot (int) or None. Match reports the tree's slot and
    changes nothing; a request takes its own *copy* in a fresh slot with an explicit
    ``copy_state`` after match (never inside it); the tree's slot is never written by a
    request. A split gives
    the new front node no state (the state belongs to the original end). A lock protects the
    locked node's state. Eviction goes least recently used first, leaves before their
    ancestors: a leaf goes whole, an internal node keeps its full KV and loses the state.

    Args:
        slots: the state pool (``MambaStatePool``) or index-only ``StateSlots``.
        policy: LRU or LFU order of evictable states.
    """

    component_type = _MAMBA
    pool_name = PoolName.MAMBA
    layout_setting = "state_layout"
    takes_part_in_loads = True
    window_pages = 1  # the state at a boundary is one trailing page
    hit_policy = PoolHitPolicy.TRAILING_PAGES

    def __init__(
        self,
        slots: MambaStatePool | StateSlots,
        policy: EvictionPolicy | str = EvictionPolicy.LRU,
    ) -> None:
        super().__init__(policy)
        self.slots = slots
        self.pool = slots if isinstance(slots, MambaStatePool) else None
        self._owned = [False] * (slots.total_size() + 1)
        self.cached_states = 0
        self.num_held = 0

    # ---------------------------------------------------------------- structure

    def split(self, parent: TreeNode, child: TreeNode) -> None:
        parent.values[self.index] = None  # the state is valid only at the child's end
        parent.lock_refs[self.index] = 0

    def _units(self, value: int) -> int:
        return 1

    def _freed(self, node: TreeNode, value: int) -> int:
        return value

    def _uncache(self, units: int) -> None:
        self.cached_states -= units

    def _cached(self) -> int:
        return self.cached_states

    # ---------------------------------------------------------------- requests

    def match_accept(self, nodes: list[TreeNode], limit: int) -> int:
        i = self.index
        for node in reversed(nodes):
            if node.seq_len <= limit and node.values[i] is not None:
                return node.seq_len
        return 0

    def insert_done(self, ctx: InsertContext, last_node: TreeNode) -> None:
        """Attach ``mamba_value`` at the key's end; a second state for the same end (or a key
        with no whole page) is dropped: the caller's slot is freed."""
        state = ctx.params.mamba_value
        if state is None:
            return
        i = self.index
        if last_node.parent is None or last_node.values[i] is not None:
            ctx.effects.dropped[i].append(state)
            return
        last_node.values[i] = state
        self.cached_states += 1
        end = ctx.aligned_len
        ctx.adopt(i, _MAMBA, end - self.tree.page_size, end, state)
        self.refresh(last_node)

    def lock(self, node: TreeNode) -> None:
        node.lock_refs[self.index] += 1
        self.evictable.discard(node)

    def unlock(self, node: TreeNode, receipt: Any) -> None:
        i = self.index
        assert node.lock_refs[i] > 0, f"Mamba unlock below zero at {node}"
        node.lock_refs[i] -= 1
        if node.lock_refs[i] == 0:
            self.refresh(node)

    # ---------------------------------------------------------------- checks

    def _check_value(self, node: TreeNode, value: int) -> None:
        assert self._owned[value], f"{node}: state slot {value} is not marked tree-owned"

    def check(self, cached: int, handles: list[Any]) -> None:
        assert sum(self._owned) == cached, f"mamba: {sum(self._owned)} slots marked owned"
        super().check(cached, handles)

    def _lock_counts(self, handles: list[Any]) -> dict[int, int]:
        expected: dict[int, int] = {}
        for handle in handles:
            if handle.parts:
                expected[id(handle.node)] = expected.get(id(handle.node), 0) + 1
        return expected

    def check_accounting(self) -> None:
        free, total = self.slots.available_size(), self.slots.total_size()
        assert self.num_held >= 0, f"mamba: negative held count {self.num_held}"
        assert free + self.cached_states + self.num_held == total, (
            f"mamba pool: free {free} + cached {self.cached_states} + held {self.num_held} "
            f"!= total {total}"
        )

    # ---------------------------------------------------------------- facade

    def fill_match(self, result: MatchResult, path: MatchPath) -> None:
        """``mamba_slot``: the tree's state at the boundary (a match ends at a node end)."""
        if path.prefix_len:
            state = path.last_node.values[self.index]
            assert state is not None and path.node_offset == path.last_node.num_tokens, (
                f"a Mamba match ends at {path.prefix_len} without a state there"
            )
            result.mamba_slot = state

    def alloc(self) -> int | None:
        """A state slot for a request (stale contents), or None when none is free."""
        slot = self.slots.alloc()
        if slot is not None:
            self.num_held += 1
        return slot

    def copy_state(self, node: TreeNode) -> int | None:
        """A fresh request-held slot holding a copy of ``node``'s state (None when no slot is
        free). The tree's slot is only read."""
        state = node.values[self.index]
        assert state is not None, f"copy_state of {node}, which has no state"
        slot = self.alloc()
        if slot is not None and self.pool is not None:
            self.pool.copy(state, slot)
        return slot

    def check_held(self, slot: Any, what: str) -> int:
        """``slot`` as an int; ValueError unless it is a request-held state slot."""
        try:
            slot = operator.index(slot)
        except TypeError:
            raise ValueError(f"{what}: a state slot is an int, got {slot!r}") from None
        if 0 <= slot < len(self._owned) and self._owned[slot]:
            raise ValueError(
                f"{what}: state slot {slot} belongs to the tree; pass a slot from alloc_state "
                "or copy_state"
            )
        if not self.slots.is_allocated(slot):
            raise ValueError(f"{what}: state slot {slot!r} is not allocated (freed already?)")
        return slot

    def free(self, slot: int) -> None:
        """Return a request-held slot. Raises ValueError for tree-owned or free slots."""
        self.slots.free(self.check_held(slot, "free_state"))
        self.num_held -= 1

    def apply(self, effects: Effects) -> None:
        i = self.index
        for state in effects.adopted[i]:
            self._owned[state] = True
            self.num_held -= 1
        for state in effects.dropped[i]:
            self.slots.free(state)
            self.num_held -= 1
        for state in effects.freed[i]:
            self._owned[state] = False
            self.slots.free(state)

    def stats(self) -> dict[str, Any]:
        return {
            "mamba_cached_states": self.cached_states,
            "mamba_held_states": self.num_held,
            "mamba_free_states": self.slots.available_size(),
            "mamba_evictable_nodes": len(self.evictable),
        }

    # ---------------------------------------------------------------- linker (DESIGN.md 5)
    # The state at a node's end is one trailing page keyed by its last page hash; LOOKUP asks
    # for every tail key (present at page i = the state at the end of page i is stored).

    def _offload_transfer(self, node: TreeNode) -> PoolTransfer | None:
        """``node``'s state slot (None when it has no state or no hashes)."""
        state = node.values[self.index]
        if state is None or not node.hash_value:
            return None
        return PoolTransfer(name=PoolName.MAMBA, keys=[node.hash_value[-1]],
                            device_indices=torch.tensor([state], dtype=torch.int64),
                            hit_policy=PoolHitPolicy.TRAILING_PAGES)

    def _reserve_load(self, keys: list[str]) -> PoolTransfer | None:
        """One fresh state slot for the tail's end, evicting a cached state when none is free
        (None when even that fails); held until the publishing insert takes it (it is the
        insert's ``mamba_value``) or ABORT frees it."""
        if not keys:
            return None
        slot = alloc_or_evict(lambda: self._make_room(1), self.alloc)
        if slot is None:
            return None
        return PoolTransfer(name=PoolName.MAMBA, keys=[keys[-1]],
                            device_indices=torch.tensor([slot], dtype=torch.int64),
                            hit_policy=PoolHitPolicy.TRAILING_PAGES)

    def _map_load(self, load: ComponentLoad) -> dict[str, Any]:
        """The publishing insert takes the reserved slot as its ``mamba_value``."""
        return {"mamba_value": int(load.slots.reshape(-1)[0])}

    def abort_load(self, load: ComponentLoad) -> None:
        """Free the reserved slot (never inserted: ABORT comes only before publishing)."""
        slot = int(load.slots.reshape(-1)[0])
        assert not self._owned[slot], f"ABORT of state slot {slot}, which the tree owns"
        self.free(slot)
