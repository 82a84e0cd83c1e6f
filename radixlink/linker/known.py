"""``KnownPages``: a bounded, aging record of pages known to be in the store, so that a prefix
evicted from the device and inserted again is not written again (its nodes are new and carry
no stored mark; its pages' hashes, and so their store keys, are the same).

Owns the record only. Must not touch the tree, the store or threads (the linker feeds it on
its own thread: offloads confirmed, pages loaded, marks revalidated).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any


class KnownPages:
    """Pages (page hash + pool) the store confirmed (written, read back, or found present)
    within the last ``max_age_s``, at most ``max_pages`` of them.

    A page is named by its pool and its chain hash: within one process that is as good as
    its store key (the chain hash already commits to the namespace; rank and format are
    fixed per process). The record keeps, per pool, a set of the hash strings the tree
    already holds, so asking about a node's pages runs in C (``str`` caches its hash) with
    no per-page Python work. Two generations: new pages go into the current one; it becomes
    the previous one after ``max_age_s / 2`` or when it holds ``max_pages / 2`` pages, and
    the previous one is dropped then. A page is therefore trusted for at most ``max_age_s``
    after it was confirmed (the linker's ``revalidate_after_s``), and the record holds about
    ``max_pages`` pages at most (about 160 bytes each: the set slot and the 64-character hash
    string, which evicted nodes no longer share).

    Args:
        max_pages: pages kept at most (0 turns the record off).
        max_age_s: how long a confirmation is trusted.
        clock: the time source (tests inject one).
    """

    def __init__(self, max_pages: int, max_age_s: float,
                 clock: Callable[[], float] = time.monotonic):
        if not isinstance(max_pages, int) or isinstance(max_pages, bool) or max_pages < 0:
            raise ValueError(f"max_known_pages must be an int >= 0, got {max_pages!r}")
        if not max_age_s > 0:
            raise ValueError(f"the known pages' age bound must be positive, got {max_age_s!r}")
        self.max_pages, self.max_age_s, self._clock = max_pages, max_age_s, clock
        now = clock()
        self._current: dict[Any, set[str]] = {}  # pool -> page hashes
        self._previous: dict[Any, set[str]] = {}
        self._current_size = 0  # pages in the current generation (all pools)
        self._current_since = self._previous_since = now
        self.num_skipped = 0

    @property
    def enabled(self) -> bool:
        return self.max_pages > 0

    def add(self, pool: Any, hashes: Iterable[str]) -> None:
        """The store holds these pages of ``pool`` now (a write or read just confirmed them)."""
        if not self.max_pages:
            return
        self._age()
        current = self._current.get(pool)
        if current is None:
            current = self._current[pool] = set()
        before = len(current)
        current.update(hashes)
        self._current_size += len(current) - before
        if self._current_size >= max(1, self.max_pages // 2):
            self._rotate(self._clock())

    def discard(self, pool: Any, hashes: Iterable[str]) -> None:
        """The store lost these pages of ``pool`` (a presence check said so)."""
        current, previous = self._current.get(pool), self._previous.get(pool)
        for page in hashes:
            if current is not None and page in current:
                current.discard(page)
                self._current_size -= 1
            if previous is not None:
                previous.discard(page)

    def unknown(self, pool: Any, hashes: Sequence[str]
                ) -> tuple[list[int] | None, Sequence[str], float | None]:
        """Which of pages ``hashes`` of ``pool`` are not known to be stored.

        Returns:
            Their indices (None: all of them), their hashes (``hashes`` itself when all),
            and since when the others are all known (the oldest of their generations; None
            when none is).
        """
        if not self.max_pages:
            return None, hashes, None
        self._age()
        current = self._current.get(pool) or ()
        previous = self._previous.get(pool) or ()
        # NOTE: the common case, in C: none of the pages is known
        if (not current or current.isdisjoint(hashes)) and (
                not previous or previous.isdisjoint(hashes)):
            return None, hashes, None
        todo, new, in_previous, num_known = [], [], False, 0
        for i, page in enumerate(hashes):
            if page in current:
                num_known += 1
            elif page in previous:
                num_known += 1
                in_previous = True
            else:
                todo.append(i)
                new.append(page)
        self.num_skipped += num_known
        return todo, new, self._previous_since if in_previous else self._current_since

    def __len__(self) -> int:
        return self._current_size + sum(map(len, self._previous.values()))

    def _age(self) -> None:
        now = self._clock()
        if now - self._current_since >= self.max_age_s / 2:
            self._rotate(now)
        if now - self._previous_since >= self.max_age_s:
            self._previous = {}

    def _rotate(self, now: float) -> None:
        self._previous, self._previous_since = self._current, self._current_since
        self._current, self._current_since, self._current_size = {}, now, 0

    def stats(self) -> dict[str, int]:
        return {"known_pages": len(self), "known_pages_skipped": self.num_skipped}
