"""``Window``: SWA's window rule in one place (DESIGN.md section 5): how many tokens and pages
back from a boundary must hold live SWA data, and what a lock, a match or a transfer covers (a
restore's trailing-window rule, in pages, is the page layer's: ``pages.restore``).

Owns arithmetic only; knows nothing of nodes' data, pools or the tree.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Window:
    """A sliding window of ``tokens`` (``W``) over pages of ``page_size`` tokens.

    ::

        tokens   ... | p p p p | p p p p | p p p p |      boundary b
                               |<------- W ------->|
                     |<------ pages * page_size -->|     (the window's whole pages)
    """

    tokens: int
    page_size: int

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, int) or isinstance(self.tokens, bool) or self.tokens <= 0:
            raise ValueError(f"the SWA window must be a positive int (tokens), got "
                             f"{self.tokens!r}")

    @property
    def pages(self) -> int:
        """``ceil(W / page_size)``: the pages a boundary needs live (the linker's trailing
        pages for SWA)."""
        return -(-self.tokens // self.page_size)

    def trailing(self, num_pages: int) -> int:
        """How many of the last ``num_pages`` pages (of a node or a loaded tail) the window
        covers: what an offload exports and a load brings."""
        return min(self.pages, num_pages)

    def span(self, end: int) -> int:
        """Tokens of window slots a match ending at ``end`` reports (whole pages)."""
        return min(end, self.pages * self.page_size)

    def first_boundary(self, live_run: int) -> int:
        """The lowest boundary a live run starting at token ``live_run > 0`` can serve: one
        with a whole window of live tokens before it (a run from token 0 needs none)."""
        ps = self.page_size
        return -(-(live_run + self.tokens) // ps) * ps

    def lock_reach(self, start: int) -> int:
        """A lock on a node starting at ``start`` covers the ancestors ending above this
        token: the window's tokens before the node's first page."""
        return start + self.page_size - self.tokens

