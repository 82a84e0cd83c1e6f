"""The hook sets between the tree and its parts: what the tree calls on every component, what a
component may call back on the tree, and what an observer (the linker) hears about.

Owns signatures only. ``radixlink.components.base.TreeComponent`` implements ``Component`` with
defaults; ``RadixTree`` implements ``TreeOps``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar, Protocol

import torch

from radixlink.contract import ComponentType
from radixlink.tree.node import Effects, InsertContext, TreeNode


class TreeOps(Protocol):
    """The tree as a component sees it: its page size and the two structural removals."""

    page_size: int
    num_components: int

    def remove_leaf(self, node: TreeNode, effects: Effects) -> None:
        """Remove unlocked leaf ``node`` (every component releases its data)."""

    def tombstone(self, node: TreeNode, index: int, effects: Effects) -> None:
        """Release component ``index``'s data on ``node``, keeping the node."""

    def iter_nodes(self) -> Iterator[TreeNode]:
        """Every non-root node, parents before children (for checks)."""


class TreeObserver(Protocol):
    """What an attached linker hears from the tree, synchronously and before the change."""

    def before_evict(self, node: TreeNode) -> None:
        """Eviction is about to free some of ``node``'s data (its full KV, its SWA window or
        its state); all of it is still intact."""


class Component(Protocol):
    """What the tree needs from one kind of cached state (FULL, SWA, MAMBA).

    ``index`` is the component's slot in ``node.values`` / ``lock_refs`` / ``evict_entries``;
    index 0 is the backbone: its data defines which tokens are on device at all.
    """

    component_type: ClassVar[ComponentType]
    index: int

    def bind(self, tree: TreeOps, index: int) -> None:
        """Called once by the tree that owns this component."""

    def match_accept(self, nodes: list[TreeNode], limit: int) -> int:
        """The largest page-aligned boundary ``<= limit`` at which this component can serve
        the prefix along ``nodes`` (0 is always acceptable). Read-only."""

    def check_prefix(self, nodes: list[TreeNode], value: torch.Tensor, prev: int) -> str | None:
        """Backbone only, before an insert changes anything: why ``value[:prev]`` is not the
        tree's own data for the first ``prev`` tokens along ``nodes`` (None when it is)."""

    def insert_overlap(self, ctx: InsertContext, node: TreeNode, start: int, end: int) -> None:
        """The key covers existing ``node`` (tokens ``[start, end)``) and this component holds
        data there: recover what it can from the caller (e.g. heal a tombstone nearby)."""

    def insert_unevict(self, ctx: InsertContext, node: TreeNode, start: int, end: int) -> None:
        """As ``insert_overlap``, but this component's value on ``node`` is a tombstone."""

    def insert_leaf(self, ctx: InsertContext, node: TreeNode, start: int, end: int) -> None:
        """Commit the caller's data for the new leaf ``node``: tokens ``[start, end)``, all of
        the leaf."""

    def insert_done(self, ctx: InsertContext, last_node: TreeNode) -> None:
        """The walk is over; ``last_node`` ends exactly at ``ctx.aligned_len``."""

    def split(self, parent: TreeNode, child: TreeNode) -> None:
        """``parent`` was just cut from the front of ``child``: divide this component's value
        and lock count between them."""

    def refresh(self, node: TreeNode) -> None:
        """``node``'s leaf status or locks may have changed: update evictable membership."""

    def keeps_leaf(self, node: TreeNode) -> bool:
        """Whether this component can still use ``node`` as a leaf (False: the tree removes
        it once it is an unlocked leaf, e.g. after its children were evicted)."""

    def release(self, node: TreeNode, effects: Effects) -> None:
        """Release this component's data on ``node`` into ``effects`` and leave the evictable
        set: the node leaves the tree, or becomes a tombstone for this component."""

    def evict(self, target: int, effects: Effects) -> None:
        """Free this component's data until ``effects.num_freed[index] >= target`` or nothing
        more is evictable."""

    def lock(self, node: TreeNode) -> Any:
        """Protect what a request at ``node`` needs; return this component's receipt."""

    def unlock(self, node: TreeNode, receipt: Any) -> None:
        """Undo the ``lock`` that returned ``receipt``."""

    def check_node(self, node: TreeNode) -> int:
        """Assert per-node rules; return the units of this component's data on ``node``."""

    def check(self, cached: int, handles: list[Any]) -> None:
        """Assert component-wide rules given the tree walk's total and the live handles."""
