"""``MambaComponent``: one recurrent-state slot per node, valid only at the node's end.

Owns the MAMBA side of the tree: node states, state locks, the state evictable set, which slots
the tree owns and the held-by-requests count. Copies state bytes only through
``MambaStatePool.copy`` (copy-on-write at match); never touches K/V pools.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from radixlink.components.base import (
    ComponentLoad,
    TreeComponent,
    alloc_or_evict,
    evict_tombstoning,
)
from radixlink.config import EvictionPolicy
from radixlink.contract import (
    ComponentType,
    MatchResult,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from radixlink.memory.pools import MambaStatePool
from radixlink.tree.lru import EvictableSet
from radixlink.tree.node import Effects, InsertContext, MatchPath, TreeNode

_MAMBA = ComponentType.MAMBA


class StateSlots:
    """State slot ids without tensors (index-only caches); ``MambaStatePool``'s alloc/free
    contract: slots ``1..num_states``, 0 reserved."""

    def __init__(self, num_states: int):
        if not isinstance(num_states, int) or isinstance(num_states, bool) or num_states <= 0:
            raise ValueError(f"num_states must be a positive int, got {num_states!r}")
        self.num_states = num_states
        self._free = list(range(num_states, 0, -1))
        self._is_free = [False] + [True] * num_states

    def total_size(self) -> int:
        return self.num_states

    def available_size(self) -> int:
        return len(self._free)

    def is_allocated(self, slot: int) -> bool:
        return isinstance(slot, int) and 1 <= slot <= self.num_states and not self._is_free[slot]

    def alloc(self) -> int | None:
        if not self._free:
            return None
        slot = self._free.pop()
        self._is_free[slot] = False
        return slot

    def free(self, slot: int) -> None:
        if not self.is_allocated(slot):
            raise ValueError(
                f"cannot free state slot {slot!r}: not allocated (double free?) or outside "
                f"1..{self.num_states}"
            )
        self._is_free[slot] = True
        self._free.append(slot)


class MambaComponent(TreeComponent):
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
    takes_part_in_loads = True
    hit_policy = PoolHitPolicy.TRAILING_PAGES

    def __init__(
        self,
        slots: MambaStatePool | StateSlots,
        policy: EvictionPolicy | str = EvictionPolicy.LRU,
    ) -> None:
        super().__init__()
        self.slots = slots
        self.pool = slots if isinstance(slots, MambaStatePool) else None
        self.policy = EvictionPolicy(policy)
        self.evictable = EvictableSet(0, self.policy, deep_first=True)
        self._owned = [False] * (slots.total_size() + 1)
        self.cached_states = 0
        self.num_held = 0

    @property
    def window_pages(self) -> int:
        return 1  # the state at a boundary is one trailing page

    def bind(self, tree: Any, index: int) -> None:
        super().bind(tree, index)
        assert index > 0, "MambaComponent cannot be the backbone"
        self.evictable = EvictableSet(index, self.policy, deep_first=True)

    # ---------------------------------------------------------------- structure

    def split(self, parent: TreeNode, child: TreeNode) -> None:
        parent.values[self.index] = None  # the state is valid only at the child's end
        parent.lock_refs[self.index] = 0

    def refresh(self, node: TreeNode) -> None:
        i = self.index
        if node.values[i] is not None and node.lock_refs[i] == 0 and node.parent is not None:
            self.evictable.add(node)
        else:
            self.evictable.discard(node)

    def keeps_leaf(self, node: TreeNode) -> bool:
        return node.values[self.index] is not None

    def release(self, node: TreeNode, effects: Effects) -> None:
        i = self.index
        self.evictable.discard(node)
        state = node.values[i]
        if state is not None:
            node.values[i] = None
            effects.freed[i].append(state)
            effects.num_freed[i] += 1
            self.cached_states -= 1

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

    def evict(self, target: int, effects: Effects) -> None:
        """Least recently used first: a leaf goes whole, an internal node keeps its full KV."""
        evict_tombstoning(self, self.evictable, target, effects)

    # ---------------------------------------------------------------- checks

    def check_node(self, node: TreeNode) -> int:
        i = self.index
        state, refs = node.values[i], node.lock_refs[i]
        assert refs >= 0, f"negative Mamba lock count on {node}"
        should = state is not None and refs == 0
        assert (node in self.evictable) == should, (
            f"{node}: in Mamba evictable set = {node in self.evictable}, expected {should}"
        )
        if state is None:
            return 0
        assert node.values[0] is not None, f"{node}: a Mamba state without full data"
        assert self._owned[state], f"{node}: state slot {state} is not marked tree-owned"
        return 1

    def check(self, cached: int, handles: list[Any]) -> None:
        assert cached == self.cached_states, (
            f"mamba: tree holds {cached} states, counter says {self.cached_states}"
        )
        assert sum(self._owned) == cached, f"mamba: {sum(self._owned)} slots marked owned"
        self.evictable.check()
        expected: dict[int, int] = {}
        for handle in handles:
            if handle.parts:
                expected[id(handle.node)] = expected.get(id(handle.node), 0) + 1
        for node in self.tree.iter_nodes():
            want = expected.get(id(node), 0)
            assert node.lock_refs[self.index] == want, (
                f"{node}: Mamba lock count {node.lock_refs[self.index]}, handles say {want}"
            )

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
        slot = alloc_or_evict(self.alloc, lambda: self.make_room(1))
        if slot is None:
            return None
        return PoolTransfer(name=PoolName.MAMBA, keys=[keys[-1]],
                            device_indices=torch.tensor([slot], dtype=torch.int64),
                            hit_policy=PoolHitPolicy.TRAILING_PAGES)

    def abort_load(self, load: ComponentLoad) -> None:
        """Free the reserved slot (never inserted: ABORT comes only before publishing)."""
        slot = int(load.slots.reshape(-1)[0])
        assert not self._owned[slot], f"ABORT of state slot {slot}, which the tree owns"
        self.free(slot)
