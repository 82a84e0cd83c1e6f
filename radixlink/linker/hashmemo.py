"""``PageHashMemo``: the page hashes a LOOKUP computed, kept for the insert of the same tokens
that follows (the engine's own insert, or the publish of a load), so every page is hashed once.

Owns a few recent (namespace, tokens, hashes) entries. Must not touch the tree: the cache asks
``hashes_for`` and hands the answer to the tree's insert as precomputed hashes.
"""

from __future__ import annotations

from collections import deque
from typing import Any

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
