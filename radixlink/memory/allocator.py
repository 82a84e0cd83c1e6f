"""Page-aligned slot allocation with exact accounting; the SWA hybrid allocator.

Owns free lists and the full->SWA slot mapping. Knows nothing of the tree or of KV tensors.
"""

from __future__ import annotations

import torch

_INT64 = torch.int64


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


class PagedAllocator:
    """Hands out whole pages of ``page_size`` consecutive, page-aligned slots.

    Slot layout (page_size = 4, num_tokens = 8)::

        slot   0 1 2 3 | 4 5 6 7 | 8 9 10 11
        page   0 (pad) | 1       | 2
               never handed out

    Page 0 is padding (engines point unused entries of a page table at slot 0), so a pool
    backing this allocator needs ``num_tokens + page_size`` rows (``num_slots``).

    Slot tensors are int64 on ``device``. ``alloc`` never returns a partial allocation.
    """

    def __init__(self, num_tokens: int, page_size: int, device: str | torch.device = "cpu"):
        _check_positive("page_size", page_size)
        _check_positive("num_tokens", num_tokens)
        if num_tokens % page_size:
            raise ValueError(
                f"num_tokens={num_tokens} is not a multiple of page_size={page_size}; "
                f"use {num_tokens // page_size * page_size or page_size}"
            )
        self.page_size = page_size
        self.num_pages = num_tokens // page_size
        # NOTE: a preallocated stack of free page ids (LIFO) avoids torch.cat on every free.
        self._stack = torch.arange(self.num_pages, 0, -1, dtype=_INT64, device=device)
        # The tensor's device, so "cuda" resolves to "cuda:0" and matches the slots we hand out.
        self.device = self._stack.device
        self._top = self.num_pages
        self._is_free = torch.ones(self.num_pages + 1, dtype=torch.bool, device=self.device)
        self._is_free[0] = False
        self._offsets = torch.arange(page_size, dtype=_INT64, device=self.device)

    @property
    def num_slots(self) -> int:
        """Rows a backing pool needs (usable slots plus the padding page)."""
        return (self.num_pages + 1) * self.page_size

    def total_size(self) -> int:
        return self.num_pages * self.page_size

    def available_size(self) -> int:
        return self._top * self.page_size

    def can_alloc(self, num_tokens: int) -> bool:
        return self._pages_for(num_tokens) <= self._top

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Slots for ``num_tokens`` rounded up to whole pages, or None when short."""
        num_pages = self._pages_for(num_tokens)
        if num_pages > self._top:
            return None
        pages = self._stack[self._top - num_pages : self._top].clone()
        self._top -= num_pages
        self._is_free[pages] = False
        return self.pages_to_slots(pages)

    def free(self, slots: torch.Tensor) -> None:
        """Return whole pages of slots. Raises ValueError (and changes nothing) on a double
        free, a slot never handed out, or a partial / unaligned page."""
        pages = self.slots_to_pages(slots)
        if pages.numel() == 0:
            return
        if bool((pages <= 0).any()) or bool((pages > self.num_pages).any()):
            raise ValueError(
                f"free of slots outside the allocator (pages {pages.min().item()}.."
                f"{pages.max().item()}, valid 1..{self.num_pages})"
            )
        if bool(self._is_free[pages].any()) or torch.unique(pages).numel() != pages.numel():
            bad = pages[self._is_free[pages]].tolist()[:8]
            raise ValueError(f"double free of pages {bad or 'repeated in one call'}")
        n = pages.numel()
        self._stack[self._top : self._top + n] = pages
        self._top += n
        self._is_free[pages] = True

    def is_allocated(self, slots: torch.Tensor) -> bool:
        """True when every page of ``slots`` is currently handed out."""
        pages = self.slots_to_pages(slots)
        if pages.numel() and not (0 < int(pages.min()) and int(pages.max()) <= self.num_pages):
            return False
        return not bool(self._is_free[pages].any())

    def pages_to_slots(self, pages: torch.Tensor) -> torch.Tensor:
        return (pages[:, None] * self.page_size + self._offsets).reshape(-1)

    def slots_to_pages(self, slots: torch.Tensor) -> torch.Tensor:
        """Page ids of whole-page slot runs; ValueError when slots are not whole pages."""
        _check_slots(slots, self.device)
        ps = self.page_size
        if slots.numel() % ps:
            raise ValueError(
                f"{slots.numel()} slots is not a whole number of pages (page_size={ps})"
            )
        if ps == 1:
            return slots.clone()
        grid = slots.reshape(-1, ps)
        heads = grid[:, 0]
        if bool((heads % ps != 0).any()) or not torch.equal(
            grid - heads[:, None], self._offsets.expand_as(grid)
        ):
            raise ValueError(f"slots are not page aligned runs of page_size={ps}")
        return heads // ps

    def _pages_for(self, num_tokens: int) -> int:
        if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 0:
            raise ValueError(f"num_tokens must be a non-negative int, got {num_tokens!r}")
        return -(-num_tokens // self.page_size)


def _check_slots(slots: torch.Tensor, device: torch.device) -> None:
    if not isinstance(slots, torch.Tensor):
        raise ValueError(f"slots must be a torch.Tensor of int64, got {type(slots).__name__}")
    if slots.dtype != _INT64:
        raise ValueError(f"slots must be int64, got {slots.dtype}")
    if slots.device != device:
        raise ValueError(f"slots are on {slots.device}, expected {device}")
    if slots.dim() != 1:
        raise ValueError(f"slots must be 1-D, got shape {tuple(slots.shape)}")
