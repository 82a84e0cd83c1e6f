"""The hybrid allocator for sliding-window models: full-attention pages plus SWA pages.

Owns the full->SWA slot mapping and its accounting. Knows nothing of the tree or of tensors
holding K/V; the two PagedAllocators it wraps own their free lists.
"""

from __future__ import annotations

import numpy as np
import torch

from radixlink.memory.allocator import PagedAllocator, outside


class SWAAllocator:
    """Pairs each full-attention page with at most one SWA page.

    The mapping is kept per slot (``translate_full_to_swa`` is one gather on the hot path)
    but set and cleared per page: a full page maps to a whole SWA page or to nothing::

        full slots   8 9 10 11 | 12 13 14 15      (page_size = 4)
        mapping      4 5  6  7 |  0  0  0  0      page 2 -> SWA page 1; page 3 unmapped

    0 means unmapped (slot 0 is padding in both pools). Every mapped SWA page is allocated in
    ``swa`` and owned by exactly one full page; ``free``/``free_swa`` return it.

    Args:
        full: allocator of the full-attention pool.
        swa: allocator of the SWA pool (same page size and device; usually fewer pages).
    """

    def __init__(self, full: PagedAllocator, swa: PagedAllocator):
        if not isinstance(full, PagedAllocator) or not isinstance(swa, PagedAllocator):
            raise ValueError("SWAAllocator needs two PagedAllocators (full, swa)")
        if full.page_size != swa.page_size:
            raise ValueError(
                f"full page_size={full.page_size} != swa page_size={swa.page_size}; "
                "build both allocators with the same page_size"
            )
        if full.device != swa.device:
            raise ValueError(f"full allocator on {full.device}, swa on {swa.device}")
        self.full = full
        self.swa = swa
        self.page_size = full.page_size
        self.device = full.device
        self._on_cpu = self.device.type == "cpu"
        # NOTE: host numpy bookkeeping whatever the device, as in PagedAllocator: a numpy op
        # costs ~1 us where a torch index, mask or reduction costs 5-10 us of dispatch (an SWA
        # free went from ~12 torch ops to a few numpy ones). On CUDA the slots cross once each
        # way instead of a device sync per check.
        self._full_to_swa = np.zeros(full.num_slots, dtype=np.int64)
        # Per SWA page: is it the target of some full page (guards double mapping).
        self._swa_mapped = np.zeros(swa.num_pages + 1, dtype=np.bool_)
        self._num_full_slots = np.array(full.num_slots, dtype=np.uint64)
        self._num_full_pages = np.array(full.num_pages, dtype=np.uint64)

    def full_available_size(self) -> int:
        return self.full.available_size()

    def swa_available_size(self) -> int:
        return self.swa.available_size()

    def full_total_size(self) -> int:
        return self.full.total_size()

    def swa_total_size(self) -> int:
        return self.swa.total_size()

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Full slots for ``num_tokens`` (whole pages), each page mapped to a fresh SWA page.

        Returns None, allocating nothing, when either pool is short.
        """
        if not (self.full.can_alloc(num_tokens) and self.swa.can_alloc(num_tokens)):
            return None
        full_slots = self.full.alloc(num_tokens)
        swa_slots = self.swa.alloc(num_tokens)
        assert full_slots is not None and swa_slots is not None, "can_alloc lied"
        swa = self._host(swa_slots)
        self._full_to_swa[self._host(full_slots)] = swa
        self._swa_mapped[swa[:: self.page_size] // self.page_size] = True
        return full_slots

    def alloc_swa(self, num_tokens: int) -> torch.Tensor | None:
        """Unmapped SWA slots (whole pages), or None when short. The caller owns them until it
        maps them with ``set_full_to_swa_mapping`` or returns them with ``swa.free``."""
        return self.swa.alloc(num_tokens)

    def set_full_to_swa_mapping(self, full_slots: torch.Tensor, swa_slots: torch.Tensor) -> None:
        """Map allocated full pages to allocated, unmapped SWA pages, position by position.

        Raises:
            ValueError: lengths differ, slots are not whole pages, a page is not allocated, a
                full page is already mapped (``free_swa`` it first) or an SWA page is already
                the target of another full page. Nothing changes then.
        """
        full_pages = self.full.host_pages(full_slots)
        swa_pages = self.swa.host_pages(swa_slots)
        if full_slots.numel() != swa_slots.numel():
            raise ValueError(f"{full_slots.numel()} full slots but {swa_slots.numel()} swa slots")
        if not self.full.is_allocated(full_slots):
            raise ValueError("set_full_to_swa_mapping: some full pages are not allocated")
        if not self.swa.is_allocated(swa_slots):
            raise ValueError("set_full_to_swa_mapping: some swa pages are not allocated")
        full = self._host(full_slots)
        if np.count_nonzero(self._full_to_swa[full]):
            raise ValueError("set_full_to_swa_mapping: full pages already mapped; free_swa first")
        if np.unique(full_pages).shape[0] != full_pages.shape[0]:
            raise ValueError("set_full_to_swa_mapping: full pages repeated")
        reused = np.unique(swa_pages).shape[0] != swa_pages.shape[0]
        if reused or np.count_nonzero(self._swa_mapped[swa_pages]):
            raise ValueError("set_full_to_swa_mapping: swa pages already mapped or repeated")
        self._full_to_swa[full] = self._host(swa_slots)
        self._swa_mapped[swa_pages] = True

    def translate_full_to_swa(self, full_slots: torch.Tensor) -> torch.Tensor:
        """SWA slot of each full slot (any slots, not only whole pages); 0 where unmapped."""
        return self._to_device(self._translate(full_slots))

    def count_mapped(self, full_slots: torch.Tensor) -> int:
        """How many of ``full_slots`` (any slots) have an SWA slot mapped."""
        return int(np.count_nonzero(self._translate(full_slots)))

    def mapped(self, full_slots: torch.Tensor) -> np.ndarray:
        """Whether each of ``full_slots`` (any slots) has an SWA slot mapped, as a host bool
        array."""
        return self._translate(full_slots) != 0

    def free(self, full_slots: torch.Tensor) -> None:
        """Free full pages and the SWA pages mapped to them.

        Raises:
            ValueError: as ``PagedAllocator.free`` (double free, foreign or unaligned slots);
                nothing changes then.
        """
        full, swa = self._mapped_swa(full_slots)
        self.full.free_host(full)  # validates; raises before anything changed
        self._release(full, swa)

    def free_swa(self, full_slots: torch.Tensor) -> None:
        """Free only the SWA pages mapped to ``full_slots`` (whole full pages) and unmap them.

        Unmapped pages are skipped, so a second call on the same slots is a no-op.
        """
        self._release(*self._mapped_swa(full_slots))

    def free_trusted(self, full_slots: torch.Tensor) -> None:
        """``free`` of whole full pages the caller knows are handed out and distinct (the tree
        releasing its own pages, or a caller's checked by insert), skipping the validation;
        see ``PagedAllocator.free_trusted``."""
        full, swa = self._mapped_trusted(full_slots)
        self.full.free_trusted(full)
        self._release(full, swa, trusted=True)

    def free_swa_trusted(self, full_slots: torch.Tensor) -> None:
        """``free_swa`` of whole full pages known good, as ``free_trusted``."""
        self._release(*self._mapped_trusted(full_slots), trusted=True)

    def check_invariants(self) -> None:
        """Assert the mapping agrees with both allocators (for tests)."""
        ps = self.page_size
        grid = self._full_to_swa.reshape(-1, ps)
        heads = grid[:, :1]
        expected = np.where(heads != 0, heads + np.arange(ps, dtype=np.int64), 0)
        assert np.array_equal(grid, expected), "full->swa mapping is not page aligned"
        is_mapped = heads[:, 0] != 0
        full_pages = torch.from_numpy(np.flatnonzero(is_mapped)).to(self.device)
        swa_pages = heads[is_mapped, 0] // ps
        assert self.full.is_allocated(self.full.pages_to_slots(full_pages)), "mapped full page free"
        assert self.swa.is_allocated(self.swa.pages_to_slots(
            torch.from_numpy(swa_pages).to(self.device))), "mapped swa page free"
        num_flags = int(np.count_nonzero(self._swa_mapped))
        num_unique = np.unique(swa_pages).shape[0]
        assert num_flags == swa_pages.shape[0] == num_unique, (
            f"swa ownership out of sync: {num_flags} flags, {swa_pages.shape[0]} mapped pages, "
            f"{num_unique} distinct"
        )

    def _translate(self, full_slots: torch.Tensor) -> np.ndarray:
        """The host SWA slots of ``full_slots`` (a new array; 0 where unmapped)."""
        _check_slot_tensor(full_slots, self.device)
        full = self._host(full_slots)
        if outside(full, self._num_full_slots):
            lo, hi = int(full.min()), int(full.max())
            raise ValueError(f"full slots {lo}..{hi} out of range 0..{self.full.num_slots - 1}")
        return self._full_to_swa[full]

    def _mapped_swa(self, full_slots: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """The host ids of ``full_slots`` (validated whole full pages) and the SWA slots mapped
        to them (may be empty)."""
        pages = self.full.host_pages(full_slots)
        if outside(pages - 1, self._num_full_pages):  # NOTE: page 0 is the padding
            raise ValueError(
                f"full slots outside the allocator (pages {int(pages.min())}.."
                f"{int(pages.max())}, valid 1..{self.full.num_pages})"
            )
        full = self._host(full_slots)
        swa = self._full_to_swa[full]
        return full, swa[np.flatnonzero(swa)]

    def _mapped_trusted(self, full_slots: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """``_mapped_swa`` without the checks (whole full pages known good)."""
        full = self._host(full_slots)
        swa = self._full_to_swa[full]
        return full, swa[np.flatnonzero(swa)]

    def _release(self, full: np.ndarray, swa: np.ndarray, *, trusted: bool = False) -> None:
        if not swa.shape[0]:
            return
        if trusted:
            self.swa.free_trusted(swa)
        else:
            self.swa.free_host(swa)
        self._swa_mapped[swa[:: self.page_size] // self.page_size] = False
        self._full_to_swa[full] = 0

    def _host(self, slots: torch.Tensor) -> np.ndarray:
        return slots.numpy() if self._on_cpu else slots.cpu().numpy()

    def _to_device(self, arr: np.ndarray) -> torch.Tensor:
        slots = torch.from_numpy(arr)
        return slots if self._on_cpu else slots.to(self.device, non_blocking=True)


def _check_slot_tensor(slots: object, device: torch.device) -> None:
    if not isinstance(slots, torch.Tensor) or slots.dtype != torch.int64 or slots.dim() != 1:
        raise ValueError(f"slots must be a 1-D int64 torch.Tensor, got {slots!r:.80}")
    if slots.device != device:
        raise ValueError(f"slots are on {slots.device}, expected {device}")


class SWAFullSide:
    """The full pool of an ``SWAAllocator`` as the ``SlotAllocator`` of ``FullComponent``.

    ``alloc`` hands out full pages with no SWA page mapped (the facade maps SWA pages to what a
    request will write; a load maps only its window); ``free`` frees full pages together with
    any SWA pages still mapped to them.
    """

    def __init__(self, allocator: SWAAllocator):
        self._hybrid = allocator
        self.page_size = allocator.page_size
        self.device = allocator.device
        self.num_pages = allocator.full.num_pages

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        return self._hybrid.full.alloc(num_tokens)

    def free(self, slots: torch.Tensor) -> None:
        self._hybrid.free(slots)

    def free_trusted(self, slots: torch.Tensor) -> None:
        self._hybrid.free_trusted(slots)

    def available_size(self) -> int:
        return self._hybrid.full_available_size()

    def explain_not_held(self, slots: torch.Tensor | np.ndarray) -> str | None:
        return self._hybrid.full.explain_not_held(slots)

    def total_size(self) -> int:
        return self._hybrid.full_total_size()
