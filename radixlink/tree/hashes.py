"""Page-hash chains from the tree: the hashes of a new leaf, the chain continued from its parent
(``hashing.key_hashes`` over the leaf's packed key), taking the hashes a caller already
computed for these tokens and computing only the rest, and ``PageHashMemo``: the tree's memory
of hashes a linker's lookup computed (handed down to it), for the insert of the same tokens.

Must not reshape the tree; knows a node only by its key, parent and hashes.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from radixlink.hashing import key_hashes
from radixlink.tokens import TOKEN_BYTES
from radixlink.tree.node import TreeNode


def leaf_hashes(parent: TreeNode, key: bytes, page_size: int, algo: str,
                known: tuple[int, list[str]] | None) -> list[str]:
    """Chain hashes of a new leaf's pages (``key``) under ``parent``: those ``known`` =
    ``(first page, hashes)`` covers are taken from it, the others are computed (continuing the
    chain either side).

    ::

        leaf pages   first ............................. first + n
        known             start ........ start + len(hashes)
        hashes       |-- computed --|--- taken ---|-- computed --|
    """
    page_bytes = page_size * TOKEN_BYTES
    first, n = parent.seq_len // page_size, len(key) // page_bytes
    namespace = parent.namespace  # a root's: its seed starts the chain
    after = parent.hash_value[-1] if parent.hash_value else None
    lo = hi = first
    if known is not None:
        start, hashes = known
        lo, hi = max(first, start), min(first + n, start + len(hashes))
    if hi <= lo:
        return key_hashes(key, page_size, algo, namespace=namespace, parent=after)
    out = []
    if lo > first:
        out = key_hashes(key[: (lo - first) * page_bytes], page_size, algo, namespace=namespace,
                         parent=after)
    out += hashes[lo - start : hi - start]
    if hi < first + n:
        out += key_hashes(key[(hi - first) * page_bytes :], page_size, algo, parent=out[-1])
    return out


_MAX_ENTRIES = 8


class PageHashMemo:
    """Recent lookups' chained page hashes, found again by the tokens they cover.

    An entry says: in ``namespace``, the pages ``[first, first + len(hashes))`` of the packed
    uint32 ``key`` have chain hashes ``hashes``. Since a chain hash depends only on the
    namespace and the tokens up to its page, those hashes are right for any other key that
    shares those tokens (checked with one ``startswith`` per entry, newest first).
    """

    def __init__(self, page_size: int, max_entries: int = _MAX_ENTRIES):
        self.page_bytes = page_size * 4
        self._entries: deque[tuple[Any, bytes, int, list[str]]] = deque(maxlen=max_entries)
        self.hits = 0

    def remember(self, namespace: Any, key: bytes, first: int, hashes: list[str]) -> None:
        """Remember the hashes of pages ``first..`` of ``key`` (packed uint32 tokens)."""
        if hashes:
            covered = (first + len(hashes)) * self.page_bytes
            self._entries.append((namespace, key[:covered], first, hashes))

    def hashes_for(self, key: bytes, namespace: Any) -> tuple[int, list[str]] | None:
        """Precomputed hashes for ``key``: ``(first page, hashes)`` covering a run of its
        pages, or None. Only pages where ``key`` and a remembered key agree are covered."""
        for ns, known, first, hashes in reversed(self._entries):
            if ns != namespace:
                continue
            if key.startswith(known):
                self.hits += 1
                return first, hashes
            if known.startswith(key):  # a shorter key: the pages it has
                usable = len(key) // self.page_bytes - first
                if usable > 0:
                    self.hits += 1
                    return first, hashes[:usable]
        return None

    def clear(self) -> None:
        self._entries.clear()
