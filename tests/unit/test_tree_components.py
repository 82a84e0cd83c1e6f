"""The component hook set: a second, Mamba-like component plugs into the tree unchanged.

The test component keeps one "state" per node, valid only at the node's end; a split leaves the
new front without one, and match accepts only boundaries that have a state. This exercises the
hooks SWA and MAMBA use (multi-component acceptance, split redistribution, removal, locks)
without those components.
"""

from __future__ import annotations

from typing import Any, ClassVar

from radixlink.components.base import TreeComponent
from radixlink.components.full import FullComponent
from radixlink.contract import ComponentType, InsertParams, PoolName
from radixlink.memory.allocator import PagedAllocator
from radixlink.tokens import token_bytes
from radixlink.tree.invariants import check_tree
from radixlink.tree.node import Effects, InsertContext, TreeNode
from radixlink.tree.tree import RadixTree


class BoundaryState(TreeComponent):
    """One opaque state per node end; ``params.mamba_value`` is the state to attach."""

    component_type: ClassVar[ComponentType] = ComponentType.MAMBA
    pool_name: ClassVar[PoolName] = PoolName.MAMBA

    def __init__(self) -> None:
        super().__init__()
        self.freed: list[Any] = []

    def match_accept(self, nodes: list[TreeNode], limit: int) -> int:
        for node in reversed(nodes):
            if node.seq_len <= limit and node.values[self.index] is not None:
                return node.seq_len
        return 0

    def insert_done(self, ctx: InsertContext, last_node: TreeNode) -> None:
        state = ctx.params.mamba_value
        if state is None or last_node.parent is None:
            return
        if last_node.values[self.index] is None:
            last_node.values[self.index] = state
            ctx.adopt(self.index, self.component_type, ctx.aligned_len - 1, ctx.aligned_len, state)
        else:
            ctx.effects.dropped[self.index].append(state)

    def split(self, parent: TreeNode, child: TreeNode) -> None:
        parent.values[self.index] = None  # the state is valid only at the child's end

    def release(self, node: TreeNode, effects: Effects) -> None:
        if node.values[self.index] is not None:
            effects.freed[self.index].append(node.values[self.index])
            effects.num_freed[self.index] += 1
            node.values[self.index] = None

    def lock(self, node: TreeNode) -> int:
        node.lock_refs[self.index] += 1
        return node.seq_len

    def unlock(self, node: TreeNode, receipt: Any) -> None:
        assert receipt == node.seq_len
        node.lock_refs[self.index] -= 1

    def check_node(self, node: TreeNode) -> int:
        assert node.lock_refs[self.index] >= 0
        return int(node.values[self.index] is not None)


def _tree(page_size: int = 4) -> tuple[RadixTree, FullComponent, BoundaryState]:
    full = FullComponent(PagedAllocator(256, page_size))
    state = BoundaryState()
    return RadixTree([full, state], page_size), full, state


def _insert(tree: RadixTree, full: FullComponent, seq: list[int], state: int | None) -> Effects:
    value = full.alloc(len(seq))
    assert value is not None
    params = InsertParams(key=seq, value=value, mamba_value=state, track_adopted_ranges=True)
    _, effects = tree.insert(token_bytes(seq), value, params, len(seq))
    full.apply(effects)
    return effects


def test_second_component_restricts_match_to_its_boundaries() -> None:
    """Scenario: insert A (16 tokens, state s1); insert A[:8] + X (state s2) splits A at 8 and
    the new front has no state. Matching A[:12] + junk: FULL accepts 12, the state component
    only boundaries with a state (none below 12), so the tree returns 0; A and A[:8] + X
    match fully at their stated ends."""
    tree, full, _ = _tree()
    a = list(range(16))
    _insert(tree, full, a, state=101)
    b = a[:8] + [77] * 8
    _insert(tree, full, b, state=102)
    check_tree(tree)
    assert tree.num_nodes == 3
    assert tree.match(token_bytes(a[:12] + [5, 5, 5, 5])).prefix_len == 0
    path = tree.match(token_bytes(a + [9] * 4))
    assert path.prefix_len == 16 and path.last_node.values[1] == 101
    assert tree.match(token_bytes(b)).prefix_len == 16


def test_second_component_data_is_released_with_the_node() -> None:
    """Evicting a FULL leaf removes the node, and every component releases its data."""
    tree, full, state = _tree()
    _insert(tree, full, [1] * 8, state=5)
    effects = tree.evict([8, 0])
    full.apply(effects)
    assert effects.freed[1] == [5] and effects.num_freed == [8, 1]
    assert tree.num_nodes == 0
    check_tree(tree)


def test_tombstoning_a_second_component_keeps_the_node() -> None:
    """Dropping only the state component's data leaves the node (FULL stays) but match now
    stops short of it; dropping the backbone takes every component's data and the leaf."""
    tree, full, _ = _tree()
    seq = [4] * 8
    _insert(tree, full, seq, state=9)
    node = tree.match(token_bytes(seq)).last_node
    effects = Effects(2)
    tree.tombstone(node, 1, effects)
    assert effects.freed[1] == [9] and node.seq_len == 8 and node.values[0] is not None
    assert tree.match(token_bytes(seq)).prefix_len == 0
    check_tree(tree)
    _insert(tree, full, seq, state=10)
    effects = Effects(2)
    tree.tombstone(node, 0, effects)
    full.apply(effects)
    assert effects.freed[1] == [10] and node.seq_len == -1 and tree.num_nodes == 0
    check_tree(tree)


def test_duplicate_state_is_dropped_and_locks_use_receipts() -> None:
    """A second state for the same end comes back as dropped; each component gets its own
    receipt back on unlock."""
    tree, full, _ = _tree()
    seq = [3] * 8
    _insert(tree, full, seq, state=1)
    effects = _insert(tree, full, seq, state=2)
    assert effects.dropped[1] == [2] and effects.adopted[1] == []
    node = tree.match(token_bytes(seq)).last_node
    handle = tree.lock(node)
    assert handle.parts == (None, 8) and node.lock_refs == [1, 1]
    check_tree(tree)
    tree.unlock(handle)
    assert node.lock_refs == [0, 0]
    check_tree(tree)


def test_tree_module_names_no_component() -> None:
    """tree.py reaches components only through hooks (no concrete component names)."""
    import inspect

    import radixlink.tree.tree as tree_module

    source = inspect.getsource(tree_module)
    for name in ("FullComponent", "SWA", "Mamba", "MAMBA", "ComponentType."):
        assert name not in source
