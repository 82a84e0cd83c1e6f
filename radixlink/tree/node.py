"""Tree records: the node, the stored index its store marks are a view on, the lock receipt,
and the effect/context records of one tree call.

Owns plain data only (the stored index included: it is fed by the linker, on its thread).
Behaviour lives in tree.py (structure) and in the components (data).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import Any, NewType

import torch

from radixlink.contract import ComponentType, InsertParams, InsertResult, PoolName

NodeId = NewType("NodeId", int)

BACKBONE_POOL = PoolName.KV
"""The pool whose pages say whether a node is stored (the backbone's full KV)."""


class StoredPages:
    """The stored index: which pages the store holds, each with the one time the store last
    confirmed it (an offload the rank group agreed succeeded, a verified load, a presence
    check), plus the backbone pages an offload is queued or in flight for.

    A page is named by its pool and its chain hash: within one process that is as good as its
    store key (the chain hash already commits to the namespace; rank and format are fixed per
    process). Because the index is keyed by page, it outlives nodes: a split fragment, or a
    prefix evicted from the device and inserted again, is stored (or in flight) exactly when
    its pages are, with no callback. Nodes read it through ``TreeNode.external_cache_stored``,
    ``stored_at`` and ``offload_inflight``.

    One clock serves both uses: a confirmation younger than ``max_age_s`` lets an offload skip
    the page (``unknown``); an older one makes the linker re-check the node's mark on its next
    hit (revalidation). Past ``max_pages`` the earliest confirmed pages go (their nodes are
    offloaded again on a later hit); the order depends only on what was confirmed, never on a
    clock, so ranks fed the same agreed events keep the same index.

    Args:
        max_pages: pages kept at most; 0 keeps every page (unbounded) and turns skipping off.
        max_age_s: how long a confirmation lets an offload skip the page.
        clock: the time source (tests inject one).
        skips: whether ``unknown`` may report pages as known (False: every page is written).
    """

    __slots__ = ("max_pages", "max_age_s", "enabled", "_clock", "_pages", "_inflight",
                 "_size", "num_skipped")

    def __init__(self, max_pages: int = 1 << 18, max_age_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic, *, skips: bool = True):
        self._clock = clock
        self._pages: dict[Any, dict[str, float]] = {}  # pool -> page hash -> confirmed at
        self._inflight: dict[str, int] = {}  # backbone page hash -> offload ticket
        self._size = 0
        self.num_skipped = 0
        self.configure(max_pages, max_age_s, skips=skips)

    def configure(self, max_pages: int, max_age_s: float, *, skips: bool = True) -> None:
        """Set the bound, the age and whether offloads may skip known pages (a linker does so
        when it attaches).

        Raises:
            ValueError: ``max_pages`` is not an int >= 0, or ``max_age_s`` is not positive.
        """
        if not isinstance(max_pages, int) or isinstance(max_pages, bool) or max_pages < 0:
            raise ValueError(f"max_known_pages must be an int >= 0, got {max_pages!r}")
        if not (isinstance(max_age_s, (int, float)) and max_age_s > 0):
            raise ValueError(f"the stored index's age bound must be positive, got "
                             f"{max_age_s!r}")
        self.max_pages, self.max_age_s = max_pages, float(max_age_s)
        self.enabled = skips and max_pages > 0  # offloads may skip pages it knows (unknown)
        self._trim()

    # ---------------------------------------------------------------- pages

    def add(self, pool: Any, hashes: Iterable[str], at: float | None = None) -> None:
        """The store holds these pages of ``pool`` now (or since ``at``)."""
        pages = self._pages.get(pool)
        if pages is None:
            pages = self._pages[pool] = {}
        before = len(pages)
        pages.update(dict.fromkeys(hashes, self._clock() if at is None else at))
        self._size += len(pages) - before
        if self.max_pages and self._size > self.max_pages:
            self._trim()

    def refresh(self, pool: Any, hashes: Iterable[str], at: float) -> None:
        """The store still holds these pages: their confirmation is ``at`` (pages the index
        does not hold stay out: membership changes only by ``add`` / ``discard``)."""
        pages = self._pages.get(pool)
        if pages:
            for page in hashes:
                if page in pages:
                    pages[page] = at

    def discard(self, pool: Any, hashes: Iterable[str]) -> None:
        """The store lost these pages of ``pool`` (or may have: they are written again)."""
        pages = self._pages.get(pool)
        if not pages:
            return
        before = len(pages)
        for page in hashes:
            pages.pop(page, None)
        self._size -= before - len(pages)

    def unknown(self, pool: Any, hashes: Sequence[str]
                ) -> tuple[list[int] | None, Sequence[str], float | None]:
        """Which of pages ``hashes`` of ``pool`` an offload must write: all but those
        confirmed within ``max_age_s`` (none are skipped when skipping is off).

        Returns:
            Their indices (None: all of them), their hashes (``hashes`` itself when all), and
            since when the others are all confirmed (the oldest time; None when none is).
        """
        pages = self._pages.get(pool)
        # NOTE: the common case, in C: none of the pages is known
        if not self.enabled or not pages or pages.keys().isdisjoint(hashes):
            return None, hashes, None
        fresh = self._clock() - self.max_age_s
        todo, new, since = [], [], None
        for i, page in enumerate(hashes):
            at = pages.get(page)
            if at is None or at <= fresh:
                todo.append(i)
                new.append(page)
            elif since is None or at < since:
                since = at
        if since is None:
            return None, hashes, None
        self.num_skipped += len(hashes) - len(todo)
        return todo, new, since

    def __len__(self) -> int:
        return self._size

    def _trim(self) -> None:
        """Drop the earliest confirmed pages past ``max_pages`` (the largest pool first)."""
        while self.max_pages and self._size > self.max_pages:
            pages = max(self._pages.values(), key=len)
            excess = min(len(pages), self._size - self.max_pages)
            for page in list(islice(pages, excess)):
                del pages[page]
            self._size -= excess

    # ---------------------------------------------------------------- node views

    def holds(self, hashes: Sequence[str]) -> bool:
        """Every backbone page of ``hashes`` is confirmed (one node's stored mark)."""
        pages = self._pages.get(BACKBONE_POOL)
        return bool(hashes) and pages is not None and all(map(pages.__contains__, hashes))

    def confirmed_at(self, hashes: Sequence[str]) -> float | None:
        """The oldest confirmation of the backbone pages ``hashes``, None unless all are."""
        if not self.holds(hashes):
            return None
        return min(map(self._pages[BACKBONE_POOL].__getitem__, hashes))

    def ticket(self, hashes: Sequence[str]) -> int:
        """The offload queued or in flight for these backbone pages (0: none)."""
        return self._inflight.get(hashes[0], 0) if hashes else 0

    def set_inflight(self, hashes: Iterable[str], ticket: int) -> None:
        """Offload ``ticket`` covers these backbone pages from now (0 clears them)."""
        if ticket:
            self._inflight.update(dict.fromkeys(hashes, ticket))
        else:
            for page in hashes:
                self._inflight.pop(page, None)

    def clear_inflight(self, hashes: Iterable[str], ticket: int) -> None:
        """Offload ``ticket`` is over for these backbone pages (pages another one covers
        since stay covered)."""
        inflight = self._inflight
        for page in hashes:
            if inflight.get(page) == ticket:
                del inflight[page]

    def stats(self) -> dict[str, int]:
        return {"known_pages": len(self), "known_pages_skipped": self.num_skipped}


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

    @property
    def is_root(self) -> bool:
        return self.parent is None and self.seq_len == 0

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def __repr__(self) -> str:
        return (
            f"TreeNode(id={self.node_id}, tokens=[{self.start}, {self.seq_len}), "
            f"children={len(self.children)}, locks={self.lock_refs})"
        )


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
        self.adopted: list[list[Any]] = [[] for _ in range(num_components)]
        self.dropped: list[list[Any]] = [[] for _ in range(num_components)]
        self.freed: list[list[Any]] = [[] for _ in range(num_components)]
        self.num_freed = [0] * num_components

    def is_empty(self) -> bool:
        return not any(self.adopted) and not any(self.dropped) and not any(self.freed)


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
