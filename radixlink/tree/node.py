"""Tree records: the node (its store marks are views on the tree's stored index,
``stored.StoredPages``) and the effect/context records of one tree call (the lock receipt is
``locks.LockHandle``).

Owns plain data only. Behaviour lives in tree.py (structure) and in the components (data).
"""

from __future__ import annotations

from itertools import repeat
from typing import Any, NewType

import torch

from radixlink.contract import ComponentType, InsertParams, InsertResult
from radixlink.tree.stored import BACKBONE_POOL, StoredPages

NodeId = NewType("NodeId", int)

class TreeNode:
    """One radix-tree node. Its edge ``key`` is a whole number of pages (packed bytes).

    Per-component state is indexed by the component's position in the tree (0 = backbone):
    ``values[i]`` is the component's data for this node's tokens (None = tombstone: the node
    stays, that component's data is gone) and ``lock_refs[i]`` its lock count.
    ``evict_entries[i]`` is the node's live entry in component i's evictable set, or None.

    ``seq_len`` is the number of tokens from the root through the end of this node; it is -1
    once the node has been removed from the tree.
    """

    __slots__ = (
        "node_id",
        "key",
        "parent",
        "children",
        "seq_len",
        "values",
        "lock_refs",
        "evict_entries",
        "hash_value",
        "hit_count",
        "last_access",
        "stored",
        "namespace",
        "stored_fresh",
    )

    def __init__(self, node_id: int, key: bytes, parent: TreeNode | None, num_components: int):
        self.node_id = NodeId(node_id)
        self.key = key
        self.parent = parent
        self.children: dict[bytes, TreeNode] = {}
        self.seq_len = 0
        self.values: list[Any] = [None] * num_components
        self.lock_refs: list[int] = [0] * num_components
        self.evict_entries: list[Any] = [None] * num_components
        self.hash_value: list[str] | None = None
        self.hit_count = 0
        self.last_access = 0
        # The tree's stored index (``StoredPages``), shared down from the root; the store
        # marks below are views on it, by this node's page hashes.
        self.stored: StoredPages | None = None if parent is None else parent.stored
        self.namespace: Any = None  # roots only: the namespace whose chain starts here
        # Revalidation's memo, a hint and never the mark: (the index's epoch, a time) before
        # which this node's stored mark is known younger than the age bound.
        self.stored_fresh: tuple[int, float] = (-1, 0.0)

    # ---------------------------------------------------------------- store marks (views)

    @property
    def external_cache_stored(self) -> bool:
        """The store holds this node's pages (every backbone page confirmed in the index)."""
        index, hashes = self.stored, self.hash_value
        return index is not None and hashes is not None and index.holds(hashes)

    @external_cache_stored.setter
    def external_cache_stored(self, value: bool) -> None:
        index, hashes = self._index()
        if value:
            index.add(BACKBONE_POOL, hashes)
        else:
            index.discard(BACKBONE_POOL, hashes)

    @property
    def stored_at(self) -> float | None:
        """When the store last confirmed this node's pages (the oldest page), or None."""
        index, hashes = self.stored, self.hash_value
        return None if index is None or hashes is None else index.confirmed_at(hashes)

    @stored_at.setter
    def stored_at(self, value: float | None) -> None:
        index, hashes = self._index()
        if value is None:
            index.discard(BACKBONE_POOL, hashes)
        else:
            index.add(BACKBONE_POOL, hashes, at=value)

    @property
    def offload_inflight(self) -> int:
        """0, or the linker's ticket of the offload queued or in flight for this node."""
        index, hashes = self.stored, self.hash_value
        return 0 if index is None or hashes is None else index.ticket(hashes)

    @offload_inflight.setter
    def offload_inflight(self, ticket: int) -> None:
        index, hashes = self._index()
        index.set_inflight(hashes, ticket)

    def _index(self) -> tuple[StoredPages, list[str]]:
        if self.stored is None or self.hash_value is None:
            raise ValueError(f"{self!r} has no page hashes or stored index: store marks need a "
                             "tree built with enable_external_cache_linker=True")
        return self.stored, self.hash_value

    @property
    def num_tokens(self) -> int:
        return len(self.key) >> 2

    @property
    def start(self) -> int:
        """Absolute token offset where this node's key begins."""
        return self.seq_len - (len(self.key) >> 2)

    def __repr__(self) -> str:
        return (
            f"TreeNode(id={self.node_id}, tokens=[{self.start}, {self.seq_len}), "
            f"children={len(self.children)}, locks={self.lock_refs})"
        )


class Effects:
    """What one tree call decided about slots, per component index; the facade applies it.

    Attributes:
        adopted: values the tree took from the caller (caller-held -> tree-owned).
        dropped: caller values the tree did not take (duplicates: caller-held -> free).
        freed: values that left the tree (evicted, replaced: tree-owned -> free).
        num_freed: per component, units freed so far in this call (tokens, or states).
    """

    __slots__ = ("adopted", "dropped", "freed", "num_freed")

    def __init__(self, num_components: int):
        # NOTE: n fresh lists each, built in C (a comprehension per list costs a call each)
        self.adopted: list[list[Any]] = list(map(list, repeat((), num_components)))
        self.dropped: list[list[Any]] = list(map(list, repeat((), num_components)))
        self.freed: list[list[Any]] = list(map(list, repeat((), num_components)))
        self.num_freed = [0] * num_components


class MatchPath:
    """The read-only outcome of a tree walk.

    Attributes:
        nodes: the nodes the accepted prefix passes through, root excluded; the last one may be
            covered only partly (``node_offset`` tokens).
        prefix_len: accepted tokens (page aligned).
        last_node: where the accepted prefix ends (the root for an empty match).
        node_offset: tokens of ``last_node`` covered by the prefix.
    """

    __slots__ = ("nodes", "prefix_len", "last_node", "node_offset")

    def __init__(self, nodes: list[TreeNode], prefix_len: int, last_node: TreeNode, offset: int):
        self.nodes = nodes
        self.prefix_len = prefix_len
        self.last_node = last_node
        self.node_offset = offset


class InsertContext:
    """One insert as the component hooks see it.

    Token ranges are absolute and half-open. The caller's slots for ``[0, aligned_len)`` are
    ``value[:aligned_len]``; below ``prev_prefix_len`` they are the tree's own already.

    ::

        key     |----------------- aligned_len ---------------|tail|
        value   |== tree's own ==|------ caller's fresh ------|    |
                0          prev_prefix_len
    """

    __slots__ = (
        "key",
        "value",
        "aligned_len",
        "prev_prefix_len",
        "params",
        "result",
        "effects",
        "track",
        "backbone_adopted",
        "notes",
    )

    def __init__(
        self,
        key: bytes,
        value: torch.Tensor,
        aligned_len: int,
        params: InsertParams,
        result: InsertResult,
        effects: Effects,
    ):
        self.key = key
        self.value = value
        self.aligned_len = aligned_len
        self.prev_prefix_len = params.prev_prefix_len
        self.params = params
        self.result = result
        self.effects = effects
        self.track = params.track_adopted_ranges
        self.backbone_adopted: list[tuple[int, int]] = []
        # Per component index: private scratch for this insert (e.g. SWA's caller live start).
        self.notes: list[Any] = [None] * len(effects.adopted)

    def adopt(self, index: int, component: ComponentType, start: int, end: int, value: Any) -> None:
        """Record that component ``index`` took the caller's data for ``[start, end)``."""
        self.effects.adopted[index].append(value)
        if index == 0:
            self.backbone_adopted.append((start, end))
        if self.track:
            self.result.record_adopted_range(component, start, end)

    def drop_duplicates(self) -> None:
        """Caller pages in ``[prev_prefix_len, aligned_len)`` that no component adopted into
        the backbone duplicate pages the tree holds: hand them back for freeing.

        ::

            caller  |== own ==|--dup--|--adopted (unevict)--|--dup--|--adopted (leaf)--|
                    0        prev                                                  aligned
        """
        pos, end, value = self.prev_prefix_len, self.aligned_len, self.value
        dropped = self.effects.dropped[0]
        for start, stop in sorted(self.backbone_adopted):
            if start > pos:
                dropped.append(value[pos:start])
            pos = max(pos, stop)
        if pos < end:
            dropped.append(value[pos:end])
