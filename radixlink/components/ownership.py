"""Which pages of one pool the tree owns: a bitmap the facade consults before freeing slots.

Owns the bitmap only. Knows nothing of the tree's shape or of the allocator's free list.
"""

from __future__ import annotations

import numpy as np
import torch

from radixlink.memory.allocator import outside


class PageOwnership:
    """A bit per page: set while the tree owns the page.

    Args:
        num_pages: pages of the pool (page ids ``1..num_pages``; 0 is the padding page).
        page_size: slots per page.
        device: where slot tensors live.

    Slot tensors passed in must be whole-page runs (as allocators hand out).
    """

    def __init__(self, num_pages: int, page_size: int, device: torch.device):
        self.page_size = page_size
        self.device = device
        self._owned = torch.zeros(num_pages + 1, dtype=torch.bool, device=device)
        # NOTE: on CPU a numpy view of the same memory makes each mark/check ~1 us instead of
        # ~5-10 us of torch dispatch; this is on every insert, evict and free.
        self._np = self._owned.numpy() if device.type == "cpu" else None
        self._num_ids = np.array(num_pages + 1, dtype=np.uint64)  # page ids are 0..num_pages

    def mark(self, slots: torch.Tensor) -> None:
        """The tree took these pages."""
        if self._np is not None:
            self._np[self._np_pages(slots)] = True
        else:
            self._owned[self._pages(slots)] = True

    def unmark(self, slots: torch.Tensor) -> None:
        """The tree let these pages go."""
        if self._np is not None:
            self._np[self._np_pages(slots)] = False
        else:
            self._owned[self._pages(slots)] = False

    def any_owned(
        self,
        slots: torch.Tensor | np.ndarray,
        start: int = 0,
        end: int | None = None,
        *,
        whole_pages: bool = False,
    ) -> bool:
        """Whether any slot of ``slots[start:end]`` lies in a tree-owned page.

        With ``whole_pages`` the caller promises page-aligned runs from ``start``, and only
        each run's first slot is looked at (``page_size`` times less work). ``slots`` may be
        the host numpy view of CPU slots (a caller that has it already).
        """
        step = self.page_size if whole_pages else 1
        if self._np is not None:
            arr = (slots if isinstance(slots, np.ndarray) else slots.numpy())[start:end:step]
            # NOTE: count_nonzero, not .any(): ~1 us where a ufunc reduction costs ~3 us here
            return np.count_nonzero(self._np[arr // self.page_size]) > 0
        assert isinstance(slots, torch.Tensor), "device slots come as a tensor"
        part = slots[start:end:step]
        return part.numel() > 0 and bool(self._owned[part // self.page_size].any())

    def pages_owned(self, pages: np.ndarray) -> np.ndarray:
        """Per page id of ``pages`` (host int64, each in ``0..num_pages``): whether the tree
        owns it, as a host bool array (input checks: no torch dispatch on CPU). Ids outside
        the pool (caller input) are not owned."""
        if pages.size and outside(pages, self._num_ids):
            inside = (pages >= 0) & (pages < self._owned.shape[0])
            owned = np.zeros(pages.shape, dtype=np.bool_)
            owned[inside] = self.pages_owned(pages[inside])
            return owned
        if self._np is not None:
            return self._np[pages]
        return self._owned[torch.from_numpy(pages).to(self.device)].cpu().numpy()

    def owned_pages(self) -> torch.Tensor:
        """Ids of every tree-owned page, ascending (for invariant checks)."""
        return torch.nonzero(self._owned).reshape(-1)

    def count(self) -> int:
        """Tree-owned pages."""
        if self._np is not None:
            return int(np.count_nonzero(self._np))
        return int(self._owned.sum().item())

    def _np_pages(self, slots: torch.Tensor) -> np.ndarray:
        arr = slots.numpy()
        return arr[:: self.page_size] // self.page_size if self.page_size > 1 else arr

    def _pages(self, slots: torch.Tensor) -> torch.Tensor:
        return slots[:: self.page_size] // self.page_size if self.page_size > 1 else slots

