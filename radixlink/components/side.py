"""``SideComponent``: the shared skeleton of a non-backbone component (SWA, MAMBA): its data on
a node is optional (None = tombstone, the full KV stays), its evictable set holds every node
with unlocked data, and eviction tombstones internal nodes and removes leaves whole.

Owns that skeleton only; the concrete component says what its value is (``_units``), what
releasing it frees (``_freed``) and which lock counts its live handles imply (``_lock_counts``).
"""

from __future__ import annotations

from typing import Any

from radixlink.components.base import TreeComponent
from radixlink.config import EvictionPolicy
from radixlink.tree.lru import EvictableSet
from radixlink.tree.node import Effects, TreeNode


class SideComponent(TreeComponent):
    """A component above the backbone whose data a node may lose while keeping its full KV.

    Args:
        policy: LRU or LFU order of evictable nodes (LRU ties: deepest first).
    """

    def __init__(self, policy: EvictionPolicy | str = EvictionPolicy.LRU) -> None:
        super().__init__()
        self.policy = EvictionPolicy(policy)
        self.evictable = EvictableSet(0, self.policy, deep_first=True)

    # ---------------------------------------------------------------- what a subclass says

    def _units(self, value: Any) -> int:
        """The units (tokens, states) of one node's value."""
        raise NotImplementedError

    def _freed(self, node: TreeNode, value: Any) -> Any:
        """What releasing ``value`` from ``node`` hands to ``apply`` (slots, a state)."""
        raise NotImplementedError

    def _uncache(self, units: int) -> None:
        """The tree no longer caches ``units`` of this component's units."""
        raise NotImplementedError

    def _cached(self) -> int:
        """Units the tree caches, by this component's counter."""
        raise NotImplementedError

    def _lock_counts(self, handles: list[Any]) -> dict[int, int]:
        """Per node id, the lock count the live ``handles`` put on this component."""
        raise NotImplementedError

    def _check_value(self, node: TreeNode, value: Any) -> None:
        """Assert the rules of one node's (non-None) value."""

    # ---------------------------------------------------------------- hooks

    def bind(self, tree: Any, index: int) -> None:
        super().bind(tree, index)
        assert index > 0, f"{type(self).__name__} cannot be the backbone"
        self.evictable = EvictableSet(index, self.policy, deep_first=True)

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
        value = node.values[i]
        if value is not None:
            num = self._units(value)
            effects.freed[i].append(self._freed(node, value))
            node.values[i] = None
            effects.num_freed[i] += num
            self._uncache(num)

    def evict(self, target: int, effects: Effects) -> None:
        """Least recently used first, until ``effects.num_freed[index] >= target``: a leaf goes
        whole (every component releases it), an internal node becomes this component's
        tombstone and keeps its full KV."""
        i, tree, pop = self.index, self.tree, self.evictable.pop
        while effects.num_freed[i] < target:
            node = pop()
            if node is None:
                break
            if node.children:
                tree.tombstone(node, i, effects)
            else:
                tree.remove_leaf(node, effects)

    def check_node(self, node: TreeNode) -> int:
        i, name = self.index, self.component_type.value
        value, refs = node.values[i], node.lock_refs[i]
        assert refs >= 0, f"negative {name} lock count on {node}"
        should = value is not None and refs == 0
        assert (node in self.evictable) == should, (
            f"{node}: in {name} evictable set = {node in self.evictable}, expected {should}"
        )
        if value is None:
            return 0
        assert node.values[0] is not None, f"{node}: {name} data without full data"
        self._check_value(node, value)
        return self._units(value)

    def check(self, cached: int, handles: list[Any]) -> None:
        name = self.component_type.value
        assert cached == self._cached(), (
            f"{name}: tree holds {cached} units, counter says {self._cached()}"
        )
        self.evictable.check()
        expected, i = self._lock_counts(handles), self.index
        for node in self.tree.iter_nodes():
            want = expected.get(id(node), 0)
            assert node.lock_refs[i] == want, (
                f"{node}: {name} lock count {node.lock_refs[i]}, live handles say {want}"
            )
