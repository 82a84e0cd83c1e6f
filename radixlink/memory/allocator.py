"""Page-aligned slot allocation with exact accounting.

Owns the free-page stack and free map of one pool. Knows nothing of the tree or of KV tensors.
"""

from __future__ import annotations

import numpy as np
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
        self.device = tensor_device(device)  # "cuda" -> "cuda:0": matches the slots handed out
        self._on_cpu = self.device.type == "cpu"
        # NOTE: the bookkeeping lives in host numpy arrays whatever the device: a numpy call
        # costs ~0.3-1 us where a torch op costs 5-10 us of dispatch (a CPU free went from ~20
        # torch ops, 150-400 us, to a few us). On CUDA it is one copy each way instead of a
        # device sync per validation check.
        self._stack = np.arange(self.num_pages, 0, -1, dtype=np.int64)  # LIFO of free pages
        self._top = self.num_pages
        # Padding page 0 reads as free, so no release path can ever push it on the stack.
        self._is_free = np.ones(self.num_pages + 1, dtype=np.bool_)
        # NOTE: the slots of every page, one row each (8 host bytes per slot, far below the
        # pool's own bytes per slot): alloc is one take() and validation one bytes compare,
        # instead of two broadcast ufuncs plus a reduction.
        self._page_slots = np.arange(self.num_slots, dtype=np.int64).reshape(-1, page_size)

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
        top = self._top
        if num_pages > top:
            return None
        pages = self._stack[top - num_pages : top]
        self._top = top - num_pages
        self._is_free[pages] = False
        return self._to_device(self._page_slots.take(pages, 0).reshape(-1))

    def free(self, slots: torch.Tensor) -> None:
        """Return whole pages of slots.

        Raises:
            ValueError: a double free (also a page repeated in one call), a slot never handed
                out (padding page 0, out of range), or a partial / unaligned page. Nothing
                changes then.
        """
        _check_slots(slots, self.device)
        self.free_host(self._host(slots))

    def free_host(self, arr: np.ndarray) -> None:
        """``free`` of host int64 slot ids (a 1-D array; a wrapping allocator that keeps its
        own bookkeeping on the host), with the same checks and errors."""
        if arr.shape[0] == self.page_size:
            self._free_one(arr)
            return
        pages = self._pages_of(arr)
        if not pages.shape[0]:
            return
        ordered = np.sort(pages)
        lo, hi = int(ordered[0]), int(ordered[-1])
        if lo <= 0 or hi > self.num_pages:
            raise ValueError(_outside(lo, hi, self.num_pages))
        freed = self._is_free[pages]
        if np.count_nonzero(freed):
            raise ValueError(f"double free of pages {pages[freed].tolist()[:8]}")
        if np.count_nonzero(ordered[1:] == ordered[:-1]):
            raise ValueError("double free of pages repeated in one call")
        self._push(pages)

    def free_trusted(self, slots: torch.Tensor) -> None:
        """Return whole pages of slots the caller knows are handed out and distinct (the tree
        releasing pages it owns), skipping the validation of ``free``.

        Only an assert guards against pushing a free or padding page (a corrupted free list);
        pass anything not known good to ``free`` instead.
        """
        arr = self._host(slots)
        pages = arr[:: self.page_size] // self.page_size if self.page_size > 1 else arr
        if pages.shape[0]:
            freed = self._is_free[pages]
            assert not np.count_nonzero(freed), (
                f"free_trusted of pages that are free or padding: {pages[freed].tolist()[:8]}"
            )
            self._push(pages)

    def is_allocated(self, slots: torch.Tensor) -> bool:
        """True when every page of ``slots`` is currently handed out."""
        _check_slots(slots, self.device)
        pages = self._pages_of(self._host(slots))
        if pages.shape[0] and not (0 < int(pages.min()) and int(pages.max()) <= self.num_pages):
            return False
        return not np.count_nonzero(self._is_free[pages])

    def explain_not_held(self, slots: torch.Tensor | np.ndarray) -> str | None:
        """Why ``slots`` are not distinct, whole, page-aligned runs that are all handed out
        right now, naming the first bad slot (None when they are). For validating caller input
        before anything changes: a handful of array ops when the slots are good."""
        arr = self._host(slots)
        ps, n = self.page_size, arr.shape[0]
        if n % ps:
            return f"{n} slots is not a whole number of pages (page_size={ps})"
        if not n:
            return None
        # NOTE: the fast path is ~8 numpy calls (a few us at 2k tokens); the message is built
        # only when something is wrong.
        pages = arr[::ps] // ps
        ordered = np.sort(pages)
        if (ordered[0] < 1 or ordered[-1] > self.num_pages
                or arr.tobytes() != self._page_slots.take(pages, 0).tobytes()
                or np.count_nonzero(self._is_free[pages])
                or np.count_nonzero(ordered[1:] == ordered[:-1])):
            return self._explain(arr)
        return None

    def _explain(self, arr: np.ndarray) -> str:
        """The slow path of ``explain_not_held``: name the first bad slot and the rule."""
        ps = self.page_size
        outside = (arr < ps) | (arr >= self.num_slots)
        if np.count_nonzero(outside):
            i = int(np.argmax(outside))
            return (f"slot {int(arr[i])} at index {i} is outside the pool (valid "
                    f"{ps}..{self.num_slots - 1}; slots 0..{ps - 1} are the padding page)")
        grid = arr.reshape(-1, ps)
        heads = grid[:, 0]
        broken = (heads % ps != 0) | np.any(grid != heads[:, None] + self._page_slots[0], axis=1)
        if np.count_nonzero(broken):
            i = int(np.argmax(broken)) * ps
            return (f"slots at index {i}..{i + ps - 1} ({grid[i // ps].tolist()}) are not one "
                    f"page-aligned run of page_size={ps}")
        pages = heads // ps
        free = self._is_free[pages]
        if np.count_nonzero(free):
            i = int(np.argmax(free))
            return (f"slot {int(heads[i])} at index {i * ps} (page {int(pages[i])}) is free: "
                    "it was never allocated or was freed already")
        order = np.argsort(pages, kind="stable")
        repeat = pages[order[1:]] == pages[order[:-1]]
        if np.count_nonzero(repeat):
            i = int(order[1:][int(np.argmax(repeat))])
            return f"page {int(pages[i])} (slot {int(heads[i])}) appears twice, at index {i * ps}"
        raise AssertionError(f"explain_not_held found nothing wrong with {arr.tolist()[:16]}")

    def pages_to_slots(self, pages: torch.Tensor) -> torch.Tensor:
        arr = self._host(pages).astype(np.int64, copy=False)
        return self._to_device((arr[:, None] * self.page_size + self._page_slots[0]).reshape(-1))

    def slots_to_pages(self, slots: torch.Tensor) -> torch.Tensor:
        """Page ids of whole-page slot runs; ValueError when slots are not whole pages."""
        return self._to_device(np.array(self.host_pages(slots), dtype=np.int64))

    def host_pages(self, slots: torch.Tensor) -> np.ndarray:
        """``slots_to_pages`` as a host int64 array (may alias the slots' host memory)."""
        _check_slots(slots, self.device)
        return self._pages_of(self._host(slots))

    def _free_one(self, arr: np.ndarray) -> None:
        """``free`` of exactly one page (a request's tail page, the common case)."""
        # NOTE: scalar checks and one bytes compare: ~2 us where the array path takes ~6 us.
        page = int(arr[0]) // self.page_size
        if not 0 < page <= self.num_pages or arr.tobytes() != self._page_slots[page].tobytes():
            self._pages_of(arr)  # raises for unaligned slots, else the page is out of range
            raise ValueError(_outside(page, page, self.num_pages))
        if self._is_free[page]:
            raise ValueError(f"double free of pages [{page}]")
        self._stack[self._top] = page
        self._top += 1
        self._is_free[page] = True

    def _push(self, pages: np.ndarray) -> None:
        top, num = self._top, pages.shape[0]
        assert top + num <= self.num_pages, f"free list overflow: {top} + {num} pages"
        self._stack[top : top + num] = pages
        self._top = top + num
        self._is_free[pages] = True

    def _pages_of(self, arr: np.ndarray) -> np.ndarray:
        """Page ids (may alias ``arr``) of whole-page slot runs; ValueError otherwise. Pages
        out of range are returned as they are (callers range-check).

        ::

            arr     |p*ps .. p*ps+ps-1|q*ps .. q*ps+ps-1|   -> pages [p, q]
        """
        ps = self.page_size
        if arr.shape[0] % ps:
            raise ValueError(
                f"{arr.shape[0]} slots is not a whole number of pages (page_size={ps})"
            )
        if ps == 1:
            return arr
        pages = arr[::ps] // ps
        expected = self._page_slots.take(pages, 0, mode="clip")
        if arr.tobytes() != expected.tobytes():
            # Slow path: out-of-range pages (clipped above) or unaligned slots; tell which.
            grid = arr.reshape(-1, ps)
            if np.count_nonzero(grid != pages[:, None] * ps + self._page_slots[0]):
                raise ValueError(f"slots are not page aligned runs of page_size={ps}")
        return pages

    def _host(self, tensor: torch.Tensor | np.ndarray) -> np.ndarray:
        if isinstance(tensor, np.ndarray):
            return tensor
        return tensor.numpy() if self._on_cpu else tensor.cpu().numpy()

    def _to_device(self, arr: np.ndarray) -> torch.Tensor:
        slots = torch.from_numpy(arr)
        # NOTE: non_blocking from pageable memory stages the bytes before returning, and skips
        # the stream sync a blocking copy would do behind queued kernels.
        return slots if self._on_cpu else slots.to(self.device, non_blocking=True)

    def _pages_for(self, num_tokens: int) -> int:
        if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 0:
            raise ValueError(f"num_tokens must be a non-negative int, got {num_tokens!r}")
        return -(-num_tokens // self.page_size)


def tensor_device(device: str | torch.device) -> torch.device:
    """``device`` as the tensors made there report it, so comparisons are exact: ``cpu:0`` is
    ``cpu``, ``cuda`` is ``cuda:<current device>``.

    Raises:
        ValueError: no such device here (e.g. ``cuda`` on a machine without a GPU).
    """
    try:
        return torch.empty(0, device=device).device
    except (RuntimeError, AssertionError) as exc:
        raise ValueError(f"device {device!r} is not usable here: {exc}") from None


def outside(values: np.ndarray, bound: np.ndarray) -> bool:
    """Whether any of the host integers ``values`` is negative or at least ``bound`` (a 0-d
    uint64 array). For int64 one compare of the uint64 view (negatives wrap above any bound)
    and a count: ~2 us where ``min()`` and ``max()`` cost ~3 us each."""
    if values.dtype == np.int64:
        return np.count_nonzero(values.view(np.uint64) >= bound) > 0
    return bool(values.size) and (int(values.min()) < 0 or int(values.max()) >= int(bound))


def _outside(lo: int, hi: int, num_pages: int) -> str:
    return f"free of slots outside the allocator (pages {lo}..{hi}, valid 1..{num_pages})"


def _check_slots(slots: torch.Tensor, device: torch.device) -> None:
    if not isinstance(slots, torch.Tensor):
        raise ValueError(f"slots must be a torch.Tensor of int64, got {type(slots).__name__}")
    if slots.dtype != _INT64:
        raise ValueError(f"slots must be int64, got {slots.dtype}")
    if slots.device != device:
        raise ValueError(f"slots are on {slots.device}, expected {device}")
    if slots.dim() != 1:
        raise ValueError(f"slots must be 1-D, got shape {tuple(slots.shape)}")
