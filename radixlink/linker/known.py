"""``KnownPages``: a bounded, aging record of pages known to be in the store, so that a prefix
evicted from the device and inserted again is not written again (its nodes are new and carry
no stored mark; its pages' hashes, and so their store keys, are the same).

Owns the record only. Must not touch the tree, the store or threads (the linker feeds it on
its own thread: offloads confirmed, pages loaded, marks revalidated).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any


class KnownPages:
    """Pages (page hash + pool) the store confirmed (written, read back, or found present)
    within the last ``max_age_s``, at most ``max_pages`` of them.

    A page is named by ``hash(page hash) ^ hash(pool)``: within one process that is as good
    as its store key (the chain hash already commits to the namespace; rank and format are
    fixed per process), and it costs no string building. Two generations of these ids: new
    ones go into the current one; it becomes the previous one after ``max_age_s / 2`` or
    when it holds ``max_pages / 2`` ids, and the previous one is dropped then. A page is
    therefore trusted for at most ``max_age_s`` after it was confirmed (the linker's
    ``revalidate_after_s``), and the record holds about ``max_pages`` ids at most (about 60
    bytes each). A 64-bit collision (odds about n^2 / 2^65) makes one page look stored,
    which costs a recompute, never data.

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
        self._current: set[int] = set()
        self._previous: set[int] = set()
        self._current_since = self._previous_since = now
        self.num_skipped = 0

    @property
    def enabled(self) -> bool:
        return self.max_pages > 0

    @staticmethod
    def ids(pool: Any, hashes: Iterable[str]) -> list[int]:
        """The record's ids of pages ``hashes`` of ``pool``."""
        salt = hash(pool)
        return [hash(h) ^ salt for h in hashes]

    def add(self, ids: Iterable[int]) -> None:
        """The store holds these pages now (a write or read just confirmed them)."""
        if not self.max_pages:
            return
        self._age()
        self._current.update(ids)
        if len(self._current) >= max(1, self.max_pages // 2):
            self._rotate(self._clock())

    def discard(self, ids: Iterable[int]) -> None:
        """The store lost these pages (a presence check said so)."""
        for page in ids:
            self._current.discard(page)
            self._previous.discard(page)

    def unknown(self, pool: Any, hashes: list[str]
                ) -> tuple[list[int] | None, list[int], float | None]:
        """Which of pages ``hashes`` of ``pool`` are not known to be stored.

        Returns:
            Their indices (None: all of them), their ids, and since when the others are all
            known (the oldest of their generations; None when none is).
        """
        salt = hash(pool)
        ids = [hash(h) ^ salt for h in hashes]
        if not self.max_pages:
            return None, ids, None
        self._age()
        current, previous = self._current, self._previous
        if current.isdisjoint(ids) and previous.isdisjoint(ids):  # NOTE: the common case, in C
            return None, ids, None
        todo, new, in_previous, num_known = [], [], False, 0
        for i, page in enumerate(ids):
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
        return len(self._current) + len(self._previous)

    def _age(self) -> None:
        now = self._clock()
        if now - self._current_since >= self.max_age_s / 2:
            self._rotate(now)
        if now - self._previous_since >= self.max_age_s:
            self._previous = set()

    def _rotate(self, now: float) -> None:
        self._previous, self._previous_since = self._current, self._current_since
        self._current, self._current_since = set(), now

    def stats(self) -> dict[str, int]:
        return {"known_pages": len(self), "known_pages_skipped": self.num_skipped}
