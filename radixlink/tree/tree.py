"""The radix tree core: walk, match, insert, split, evict and the offload chain (locks:
``LockTable``, locks.py).

Owns structure (keys, parents, children, sizes), the per-tree clock, hit counts and page hashes.
Never names a component and never touches allocators: slot decisions come back as ``Effects``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from radixlink.contract import InsertParams, InsertResult
from radixlink.hashing import namespace_id
from radixlink.tokens import TOKEN_BYTES
from radixlink.tree.hashes import PageHashMemo, leaf_hashes
from radixlink.tree.keys import common_prefix_bytes
from radixlink.tree.locks import LockHandle, LockTable
from radixlink.tree.node import Effects, InsertContext, MatchPath, TreeNode
from radixlink.tree.protocol import Component, TreeObserver
from radixlink.tree.stored import StoredPages


class RadixTree:
    """A radix tree over whole pages with per-component data on each node.

    Args:
        components: the components, backbone first (its data says which tokens are cached).
        page_size: tokens per page; every edge key is a whole number of pages.
        hashing: compute ``node.hash_value`` (one hex hash per page, chained from the parent)
            for new nodes. Off costs nothing.
        hash_algo: the page hash function when hashing.
        namespace: the default namespace (its chain seed starts the main root's hashes).
    """

    def __init__(
        self,
        components: Sequence[Component],
        page_size: int,
        *,
        hashing: bool = False,
        hash_algo: str = "sha256",
        namespace: Any = None,
    ):
        if not components:
            raise ValueError("a tree needs at least one component (the backbone)")
        self.page_size = page_size
        self.page_bytes = page_size * TOKEN_BYTES
        self.components: tuple[Component, ...] = tuple(components)
        # Dependents release before the backbone: they may still read its value.
        self._release_order = self.components[::-1]
        self.num_components = len(self.components)
        self.hashing = hashing
        self.hash_algo = hash_algo
        self.clock = 0
        self.num_nodes = 0
        # NOTE: moves whenever tree-owned data is freed (evicted, or replaced by a heal): the
        # only way a prefix the tree served can shrink or move to other slots. A caller that
        # saw the tree at one epoch knows, while it holds, that its match still holds.
        self.epoch = 0
        # NOTE: set while a linker is attached; one None check per victim.
        self.observer: TreeObserver | None = None
        # Which pages the store holds (the nodes' store marks are views on it, by page hash).
        self.stored = StoredPages()
        # Page hashes a linker's lookup computed, for the insert of the same tokens.
        self.hash_memo = PageHashMemo(page_size)
        self.kv_events: Any = None  # a KVEventQueue: device STORED / REMOVED per node
        self._next_id = 0
        self._root_ids: set[int] = set()
        self.locks = LockTable(self.components, self._root_ids)
        self.root = self._new_root(namespace)
        self._roots: dict[str, TreeNode] = {namespace_id(namespace): self.root}
        for index, component in enumerate(self.components):
            component.bind(self, index)

    # ------------------------------------------------------------------ match

    def match(self, key: bytes, namespace: Any = None, *, touch: bool = True) -> MatchPath:
        """The longest whole-page prefix of ``key`` that every component accepts.

        Read-only except for recency: with ``touch`` the accepted path's ``last_access``
        moves to a new clock tick; without it (a peek) nothing changes at all. Never splits;
        the prefix may end inside ``last_node``. An empty match ends at the main root.
        """
        root = self.root if namespace is None else self._roots.get(namespace_id(namespace))
        if root is None:
            return MatchPath([], 0, self.root, 0)
        nodes, matched = self._walk(root, key, len(key) - len(key) % self.page_bytes)
        return self._accept(nodes, matched >> 2, touch)

    def match_node(self, node: TreeNode) -> MatchPath:
        """``match`` of the tokens from the root through ``node`` (one an insert just returned),
        with no walk of a key: what every component accepts along its path. A peek."""
        return self._accept(self.path_to(node), node.seq_len, False)

    def _accept(self, nodes: list[TreeNode], limit: int, touch: bool) -> MatchPath:
        """The longest boundary ``<= limit`` every component accepts along ``nodes`` (a walk's
        path), as a ``MatchPath``; with ``touch`` the accepted nodes' recency moves."""
        components = self.components
        if len(components) == 1:
            limit = components[0].match_accept(nodes, limit)
        else:
            while True:  # boundaries each component accepts need not be downward closed
                start = limit
                for component in components:
                    limit = component.match_accept(nodes, limit)
                if limit == start:
                    break
        while nodes and nodes[-1].seq_len - (len(nodes[-1].key) >> 2) >= limit:
            nodes.pop()
        if not nodes:
            return MatchPath(nodes, 0, self.root, 0)
        if touch:
            self.clock += 1
            clock = self.clock
            for node in nodes:
                node.last_access = clock
        last = nodes[-1]
        return MatchPath(nodes, limit, last, limit - last.seq_len + (len(last.key) >> 2))

    def _walk(self, root: TreeNode, key: bytes, limit: int) -> tuple[list[TreeNode], int]:
        """Nodes whose keys match ``key[:limit]`` page by page, and the matched bytes; the
        last node may match only partly."""
        pb = self.page_bytes
        nodes: list[TreeNode] = []
        node, pos = root, 0
        while pos < limit:
            child = node.children.get(key[pos : pos + pb])
            if child is None:
                break
            ckey = child.key
            end = pos + len(ckey)
            nodes.append(child)
            if end <= limit and key[pos:end] == ckey:
                node, pos = child, end
                continue
            pos += common_prefix_bytes(ckey, key[:limit], pos, pb)
            break
        return nodes, pos

    # ------------------------------------------------------------------ insert

    def insert(
        self,
        key: bytes,
        value: torch.Tensor,
        params: InsertParams,
        aligned_len: int,
        *,
        hit: bool = True,
        page_hashes: tuple[int, list[str]] | None = None,
        strict_prefix: bool = False,
    ) -> tuple[InsertResult, Effects]:
        """Insert ``key[:aligned_len]`` with the caller's ``value`` (DESIGN.md section 4).

        The caller's slots below ``params.prev_prefix_len`` are the tree's own; above it, pages
        the tree already holds are duplicates (``Effects.dropped``), tombstones adopt the
        caller's data (unevict) and the rest becomes a new leaf (``Effects.adopted``). With
        ``hit`` (and not ``params.chunked``) the existing nodes on the path count a hit.
        ``page_hashes`` = ``(first page, hashes)``: chain hashes of pages ``first..`` of
        ``key`` already computed by the caller (in the insert's namespace); a new leaf takes
        those it covers instead of hashing them again. With ``strict_prefix`` the caller's
        slots below ``prev_prefix_len`` must be exactly the tree's there (a linker's publish).

        Raises:
            ValueError: ``prev_prefix_len`` exceeds what the tree holds of this key, or (strict)
                the caller's slots below it are not the tree's slots there; nothing changed.
        """
        namespace = params.namespace
        root = self.root if namespace is None else self._roots.get(namespace_id(namespace))
        nodes, matched = ([], 0) if root is None else self._walk(root, key, aligned_len << 2)
        matched >>= 2
        prev = params.prev_prefix_len
        held = self.components[0].match_accept(nodes, matched) if prev else 0
        if held < prev:
            raise ValueError(
                f"prev_prefix_len={prev} but the tree holds only {held} tokens of this key; "
                "pass the prefix_len of a match whose last_node you locked"
            )
        if prev and strict_prefix:
            problem = self.components[0].check_prefix(nodes, value, prev)
            if problem is not None:
                raise ValueError(problem)
        if root is None:  # a new namespace: created only once the insert is known to be valid
            root = self._roots[namespace_id(namespace)] = self._new_root(namespace)
        if nodes and matched < nodes[-1].seq_len:
            nodes[-1] = self._split(nodes[-1], matched - nodes[-1].start)
        effects = Effects(self.num_components)
        result = InsertResult(prefix_len=matched)
        ctx = InsertContext(key, value, aligned_len, params, result, effects)
        self.clock += 1
        clock, hit = self.clock, hit and not params.chunked
        components, events = self.components, self.kv_events
        for node in nodes:
            node.last_access = clock
            if hit:
                node.hit_count += 1
            start, end = node.seq_len - (len(node.key) >> 2), node.seq_len
            revived = events is not None and node.values[0] is None
            for component in components:
                if node.values[component.index] is None:
                    component.insert_unevict(ctx, node, start, end)
                else:
                    component.insert_overlap(ctx, node, start, end)
            if revived and node.values[0] is not None:
                events.emit_node("stored", "device", node)
        last = nodes[-1] if nodes else root
        if matched < aligned_len:
            leaf = self._add_leaf(last, key[matched * TOKEN_BYTES : aligned_len * TOKEN_BYTES],
                                  page_hashes)
            leaf.last_access = clock
            for component in components:
                component.insert_leaf(ctx, leaf, matched, aligned_len)
            for component in components:
                component.refresh(last)
                component.refresh(leaf)
            last = leaf
            if events is not None:
                events.emit_node("stored", "device", leaf)
        for component in components:
            component.insert_done(ctx, last)
        if aligned_len > prev:
            ctx.drop_duplicates()
        if any(effects.freed):  # NOTE: a heal replaced tree-owned slots
            self.epoch += 1
        result.last_node = last
        return result, effects

    def _add_leaf(self, parent: TreeNode, key: bytes,
                  known: tuple[int, list[str]] | None = None) -> TreeNode:
        self._next_id += 1
        leaf = TreeNode(self._next_id, key, parent, self.num_components)
        leaf.seq_len = parent.seq_len + (len(key) >> 2)
        parent.children[key[: self.page_bytes]] = leaf
        self.num_nodes += 1
        if self.hashing:
            leaf.hash_value = leaf_hashes(parent, key, self.page_size, self.hash_algo, known)
        return leaf

    def _split(self, node: TreeNode, num_tokens: int) -> TreeNode:
        """Cut the first ``num_tokens`` (whole pages) of ``node`` into a new parent; ``node``
        keeps the rest, so handles and references to it stay valid. Returns the new parent."""
        assert 0 < num_tokens < node.num_tokens and num_tokens % self.page_size == 0, (
            f"split of {node} at {num_tokens} tokens"
        )
        cut = num_tokens * TOKEN_BYTES
        old_parent = node.parent
        assert old_parent is not None, f"split of a root {node}"
        self._next_id += 1
        parent = TreeNode(self._next_id, node.key[:cut], old_parent, self.num_components)
        parent.seq_len = node.start + num_tokens
        parent.hit_count = node.hit_count
        parent.last_access = node.last_access
        if node.hash_value is not None:
            pages = num_tokens // self.page_size
            parent.hash_value = node.hash_value[:pages]
            node.hash_value = node.hash_value[pages:]
        pb = self.page_bytes
        old_parent.children[parent.key[:pb]] = parent
        node.key = node.key[cut:]
        node.parent = parent
        parent.children[node.key[:pb]] = node
        self.num_nodes += 1
        for component in self.components:
            component.split(parent, node)
        return parent

    # ------------------------------------------------------------------ removal / eviction

    def evict(self, targets: Sequence[int]) -> Effects:
        """Ask each component (backbone first) to free until ``targets[i]`` units are freed."""
        effects = Effects(self.num_components)
        for component, target in zip(self.components, targets, strict=True):
            if target > effects.num_freed[component.index]:
                component.evict(target, effects)
        if any(effects.freed):
            self.epoch += 1
        return effects

    def remove_leaf(self, node: TreeNode, effects: Effects) -> None:
        """Remove leaf ``node`` (every component releases its data into ``effects``); an
        unlocked parent left as a leaf that some component no longer keeps goes too, and so
        does a request namespace's root left without children. The ``observer`` (if set) sees
        each node that still holds backbone data first, while that data is intact."""
        while True:
            assert not node.children and node.parent is not None, f"remove_leaf({node})"
            assert not any(node.lock_refs), f"remove_leaf of locked {node}"
            if self.observer is not None and node.values[0] is not None:
                self.observer.before_evict(node)
            if self.kv_events is not None and node.values[0] is not None:
                self.kv_events.emit_node("removed", "device", node)
            for component in self._release_order:
                component.release(node, effects)
            parent = node.parent
            del parent.children[node.key[: self.page_bytes]]
            node.parent = None
            node.seq_len = -1
            self.num_nodes -= 1
            if parent.children:
                return
            if parent.parent is None:
                if parent is not self.root:  # NOTE: else every distinct cache_salt leaks a root
                    del self._roots[namespace_id(parent.namespace)]
                    self._root_ids.discard(id(parent))
                return
            if any(parent.lock_refs) or self._keeps_leaf(parent):
                for component in self.components:
                    component.refresh(parent)
                return
            node = parent

    def tombstone(self, node: TreeNode, index: int, effects: Effects) -> None:
        """Release component ``index``'s data on ``node``, keeping the node for the others.
        The backbone's data goes with every component's (they all depend on it). An unlocked
        leaf some component no longer keeps (see ``_keeps_leaf``) is removed. The
        ``observer`` sees the node first, while all its data is intact (a write-back linker
        exports a dependent component's data before its own eviction frees it)."""
        assert node.parent is not None, f"tombstone of a root {node}"
        if node.values[0] is not None and node.values[index] is not None:
            if self.observer is not None:
                self.observer.before_evict(node)
            if index == 0 and self.kv_events is not None:
                self.kv_events.emit_node("removed", "device", node)
        released = self._release_order if index == 0 else (self.components[index],)
        for component in released:
            component.release(node, effects)
        if not node.children and not any(node.lock_refs) and not self._keeps_leaf(node):
            self.remove_leaf(node, effects)
            return
        for component in self.components:
            component.refresh(node)

    def _keeps_leaf(self, node: TreeNode) -> bool:
        """Whether leaf ``node`` is still worth keeping: every component can use it (the
        backbone has its data; e.g. a leaf with no window data can never be matched)."""
        return all(component.keeps_leaf(node) for component in self.components)

    # ------------------------------------------------------------------ locks

    def lock(self, node: TreeNode) -> LockHandle:
        """Protect ``node`` for a request (``LockTable.lock``)."""
        return self.locks.lock(node)

    def unlock(self, handle: LockHandle) -> None:
        """Release a ``lock`` receipt (``LockTable.unlock``)."""
        self.locks.unlock(handle)

    def live_handles(self) -> list[LockHandle]:
        return self.locks.held()

    # ------------------------------------------------------------------ linker support

    def backup_chain(self, node: TreeNode) -> list[TreeNode]:
        """Nodes to offload for ``node``: every node on its path that is neither stored nor
        in flight, ancestors first (an ancestor the store lost is exported again even below
        a descendant still marked stored: a child page is useless without its prefix)."""
        chain: list[TreeNode] = []
        while node.parent is not None:
            if not (node.external_cache_stored or node.offload_inflight):
                chain.append(node)
            node = node.parent
        chain.reverse()
        return chain

    # ------------------------------------------------------------------ traversal

    def roots(self) -> list[TreeNode]:
        return list(self._roots.values())

    def iter_nodes(self) -> Iterator[TreeNode]:
        """Every non-root node, parents before children."""
        stack = [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def path_to(self, node: TreeNode) -> list[TreeNode]:
        """Nodes from below the root down to ``node`` (empty for a root)."""
        path = []
        while node.parent is not None:
            path.append(node)
            node = node.parent
        path.reverse()
        return path

    def _new_root(self, namespace: Any) -> TreeNode:
        self._next_id += 1
        root = TreeNode(self._next_id, b"", None, self.num_components)
        root.stored = self.stored
        root.namespace = namespace
        self._root_ids.add(id(root))
        return root
