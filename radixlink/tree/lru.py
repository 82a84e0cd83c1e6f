"""The evictable set of one component: a heap of nodes ordered by LRU or LFU, lazily maintained.

Owns ordering only. Which nodes belong in it is decided by the component that owns the set.
"""

from __future__ import annotations

import heapq

from radixlink.config import EvictionPolicy
from radixlink.tree.node import TreeNode

_Entry = tuple[int, int, int, TreeNode]  # (primary key, secondary key, push seq, node)


class EvictableSet:
    """Nodes that may be evicted now, popped least-recently (or least-frequently) used first.

    Keys: LRU ``(last_access, 0)``; LFU ``(hit_count, last_access)``. With ``deep_first`` the
    LRU tie-break is ``-seq_len``: of nodes used at the same tick (a matched path), the deepest
    goes first, so a path is evicted leaf first. Keys only grow (``seq_len`` never changes), so
    a node's entry is re-keyed lazily: touching a node just updates its fields, and ``pop``
    re-pushes an entry whose key went stale instead of returning it. Removal is lazy too (the
    node forgets its entry; the heap drops it when it surfaces). Every operation is
    O(log n) amortised; nothing scans the tree.

    Args:
        index: the owning component's position (which ``node.evict_entries`` slot to use).
        policy: LRU or LFU.
        deep_first: LRU ties go to the deepest node first (hybrid components).
    """

    def __init__(
        self,
        index: int,
        policy: EvictionPolicy | str = EvictionPolicy.LRU,
        *,
        deep_first: bool = False,
    ):
        self._heap: list[_Entry] = []
        self._index = index
        self._lfu = EvictionPolicy(policy) is EvictionPolicy.LFU
        self._deep_first = deep_first
        self._seq = 0
        self.num_members = 0

    def __len__(self) -> int:
        return self.num_members

    @property
    def heap_size(self) -> int:
        """Heap entries, stale ones included (bounded by ``2 * members + 64``)."""
        return len(self._heap)

    def __contains__(self, node: TreeNode) -> bool:
        return node.evict_entries[self._index] is not None

    def add(self, node: TreeNode) -> None:
        """Make ``node`` a member (no-op when it already is)."""
        if node.evict_entries[self._index] is not None:
            return
        self.num_members += 1
        self._push(node)
        if len(self._heap) > 2 * self.num_members + 64:
            self._compact()

    def discard(self, node: TreeNode) -> None:
        """Remove ``node`` if it is a member."""
        if node.evict_entries[self._index] is not None:
            node.evict_entries[self._index] = None
            self.num_members -= 1

    def pop(self) -> TreeNode | None:
        """Remove and return the member with the smallest key, or None when empty."""
        heap, i = self._heap, self._index
        while heap:
            entry = heapq.heappop(heap)
            node = entry[3]
            if node.evict_entries[i] is not entry:
                continue  # stale: removed or re-pushed since
            if self._lfu:
                fresh = entry[0] == node.hit_count and entry[1] == node.last_access
            else:
                fresh = entry[0] == node.last_access
            if not fresh:
                self._push(node)
                continue
            node.evict_entries[i] = None
            self.num_members -= 1
            return node
        return None

    def members(self) -> list[TreeNode]:
        """Live members, unordered (for checks and tests; O(heap))."""
        i = self._index
        return [e[3] for e in self._heap if e[3].evict_entries[i] is e]

    def check(self) -> None:
        """Assert the heap holds exactly one live entry per member."""
        live = self.members()
        assert len(live) == self.num_members, (
            f"evictable set {self._index}: {len(live)} live heap entries, "
            f"{self.num_members} members"
        )
        assert len({id(n) for n in live}) == len(live), "evictable set: a node appears twice"

    def _push(self, node: TreeNode) -> None:
        self._seq += 1
        if self._lfu:
            entry = (node.hit_count, node.last_access, self._seq, node)
        else:
            entry = (node.last_access, -node.seq_len if self._deep_first else 0, self._seq, node)
        node.evict_entries[self._index] = entry
        heapq.heappush(self._heap, entry)

    def _compact(self) -> None:
        i = self._index
        self._heap = [e for e in self._heap if e[3].evict_entries[i] is e]
        heapq.heapify(self._heap)
