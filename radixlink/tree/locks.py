"""Locks of one tree: the receipt (``LockHandle``) and the ``LockTable`` that hands them out:
taking every component's lock on a node, giving it back exactly once, and the receipts still
held (for invariant checks).

Owns the receipts only. The components own what a lock protects (``Component.lock``); the
tree says which roots are its own.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

from radixlink.tree.node import TreeNode
from radixlink.tree.protocol import Component


class LockHandle:
    """A receipt for one ``lock``; ``unlock`` takes it back exactly once.

    ``parts`` holds each component's own receipt (e.g. which window an SWA lock covered).
    A handle on a root is valid and protects nothing.
    """

    __slots__ = ("node", "parts", "owner", "handle_id", "released")

    def __init__(self, node: TreeNode, parts: tuple[Any, ...], owner: object, handle_id: int):
        self.node = node
        self.parts = parts
        self.owner = owner
        self.handle_id = handle_id
        self.released = False

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        return f"LockHandle(id={self.handle_id}, node={self.node.node_id}, {state})"


class LockTable:
    """Lock receipts of one tree.

    Args:
        components: the tree's components, backbone first (each takes its own lock).
        root_ids: the ``id`` of every root of this tree (the tree's own set, kept current by
            it; read, never changed here).
    """

    def __init__(self, components: Sequence[Component], root_ids: Container[int]):
        self.components = tuple(components)
        self._root_ids = root_ids
        self._next_id = 0
        self._held: dict[int, LockHandle] = {}

    def lock(self, node: TreeNode) -> LockHandle:
        """Protect ``node`` for a request; returns the receipt for ``unlock``.

        Raises:
            ValueError: ``node`` was removed from the tree or belongs to another tree.
        """
        if not isinstance(node, TreeNode) or node.seq_len < 0:
            raise ValueError(f"cannot lock {node!r}: it was evicted; match again and lock")
        top = node
        while top.parent is not None:
            top = top.parent
        if id(top) not in self._root_ids:
            raise ValueError(f"cannot lock {node!r}: it belongs to another cache")
        parts: tuple[object, ...] = ()
        if node is not top:
            receipts = []
            for component in self.components:
                receipts.append(component.lock(node))
            parts = tuple(receipts)
        self._next_id += 1
        handle = LockHandle(node, parts, self, self._next_id)
        self._held[handle.handle_id] = handle
        return handle

    def unlock(self, handle: LockHandle) -> None:
        """Release a ``lock`` receipt.

        Raises:
            ValueError: ``handle`` was already released or is not from this tree.
        """
        if not isinstance(handle, LockHandle) or handle.owner is not self:
            raise ValueError(f"unlock of {handle!r}: not a lock handle of this cache")
        if handle.released:
            raise ValueError(f"unlock of {handle!r}: it was already released (unlock once)")
        handle.released = True
        del self._held[handle.handle_id]
        # NOTE: a root handle has no parts: zip stops at once.
        for component, receipt in zip(self.components, handle.parts, strict=False):
            component.unlock(handle.node, receipt)

    def held(self) -> list[LockHandle]:
        """Every receipt not yet released."""
        return list(self._held.values())
