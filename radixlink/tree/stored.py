"""``StoredPages``: the stored index, the one record of which pages the store holds (DESIGN.md
section 5b, "Offload"). ``TreeNode``'s store marks are views on it, by page hash.

Owns plain data (fed by the linker on its thread). Must not touch nodes, stores or threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import Any

from radixlink.contract import PoolName

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

    __slots__ = ("max_pages", "max_age_s", "enabled", "epoch", "_clock", "_pages", "_inflight",
                 "_size", "_latest", "num_skipped")

    def __init__(self, max_pages: int = 1 << 18, max_age_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic, *, skips: bool = True):
        self._clock = clock
        self._pages: dict[Any, dict[str, float]] = {}  # pool -> page hash -> confirmed at
        self._inflight: dict[str, int] = {}  # backbone page hash -> offload ticket
        self._size = 0
        # NOTE: confirmations normally only move forward in time. ``epoch`` counts the events
        # that may move one back (a time older than the latest given, a clear), so a memo of
        # "fresh until" (revalidation's) is trusted only within one epoch.
        self.epoch = 0
        self._latest = float("-inf")
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

    def clear(self) -> None:
        """Forget every page (a new linker attaches: its store may be another)."""
        self._pages.clear()
        self._inflight.clear()
        self._size = 0
        self.epoch += 1

    # ---------------------------------------------------------------- pages

    def add(self, pool: Any, hashes: Iterable[str], at: float | None = None) -> None:
        """The store holds these pages of ``pool`` now (or since ``at``)."""
        pages = self._pages.get(pool)
        if pages is None:
            pages = self._pages[pool] = {}
        before = len(pages)
        when = self._clock() if at is None else at
        self._moved_to(when)
        pages.update(dict.fromkeys(hashes, when))
        self._size += len(pages) - before
        if self.max_pages and self._size > self.max_pages:
            self._trim()

    def refresh(self, pool: Any, hashes: Iterable[str], at: float) -> None:
        """The store still holds these pages: their confirmation is ``at`` (pages the index
        does not hold stay out: membership changes only by ``add`` / ``discard``)."""
        pages = self._pages.get(pool)
        if pages:
            self._moved_to(at)
            for page in hashes:
                if page in pages:
                    pages[page] = at

    def _moved_to(self, when: float) -> None:
        """A confirmation is set to ``when``: a new epoch if that is earlier than the latest."""
        if when < self._latest:
            self.epoch += 1
        else:
            self._latest = when

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
        pages = self._pages.get(BACKBONE_POOL)
        if not hashes or pages is None:
            return None
        try:  # NOTE: one pass: a page missing from the index is the KeyError
            return min(map(pages.__getitem__, hashes))
        except KeyError:
            return None

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
