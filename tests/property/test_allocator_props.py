"""Random alloc/free sequences against a reference model (set of allocated pages).

After every step: free + allocated == total, the allocator agrees with the model page by page,
slot 0 is never handed out, and misuse (double free) changes nothing. Frees go through both the
validated ``free`` and the tree's ``free_trusted``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from radixlink.memory import PagedAllocator, SWAAllocator

_SETTINGS = settings(max_examples=40, stateful_step_count=30, deadline=None, derandomize=True)


class PagedAllocatorMachine(RuleBasedStateMachine):
    """PagedAllocator vs a set of allocated page ids."""

    held = Bundle("held")

    @initialize(page_size=st.sampled_from([1, 4, 16]), num_pages=st.integers(1, 12))
    def setup(self, page_size: int, num_pages: int) -> None:
        self.ps = page_size
        self.alloc = PagedAllocator(num_pages * page_size, page_size)
        self.allocated: set[int] = set()
        self.freed: list[frozenset[int]] = []

    def _pages(self, slots: torch.Tensor) -> frozenset[int]:
        return frozenset((slots.view(-1, self.ps)[:, 0] // self.ps).tolist())

    @rule(target=held, num_tokens=st.integers(0, 40))
    def alloc_tokens(self, num_tokens: int) -> torch.Tensor:
        want = -(-num_tokens // self.ps)
        free_pages = self.alloc.num_pages - len(self.allocated)
        slots = self.alloc.alloc(num_tokens)
        if want > free_pages:
            assert slots is None, "alloc must return None when short"
            return torch.empty(0, dtype=torch.int64)
        assert slots is not None and slots.numel() == want * self.ps
        pages = self._pages(slots) if want else frozenset()
        assert len(pages) == want and not pages & self.allocated, "handed out a held page"
        assert 0 not in pages, "padding page 0 handed out"
        self.allocated |= pages
        return slots

    @rule(slots=consumes(held))
    def free(self, slots: torch.Tensor) -> None:
        self.alloc.free(slots)
        pages = self._pages(slots) if slots.numel() else frozenset()
        self.allocated -= pages
        if pages:
            self.freed.append(pages)

    @rule(slots=consumes(held))
    def free_trusted(self, slots: torch.Tensor) -> None:
        self.alloc.free_trusted(slots)
        pages = self._pages(slots) if slots.numel() else frozenset()
        self.allocated -= pages
        if pages:
            self.freed.append(pages)

    @precondition(lambda self: bool(self.freed))
    @rule(data=st.data())
    def double_free(self, data: st.DataObject) -> None:
        pages = data.draw(st.sampled_from(self.freed))
        if pages & self.allocated:
            return  # some were handed out again: freeing them would not be a double free
        slots = self.alloc.pages_to_slots(torch.tensor(sorted(pages), dtype=torch.int64))
        before = self.alloc.available_size()
        with pytest.raises(ValueError, match="double free"):
            self.alloc.free(slots)
        assert self.alloc.available_size() == before

    @invariant()
    def accounting(self) -> None:
        held_tokens = len(self.allocated) * self.ps
        assert self.alloc.available_size() + held_tokens == self.alloc.total_size()
        if self.allocated:
            held = torch.tensor(sorted(self.allocated), dtype=torch.int64)
            assert self.alloc.is_allocated(self.alloc.pages_to_slots(held))
        free = sorted(set(range(1, self.alloc.num_pages + 1)) - self.allocated)
        for page in free[:4]:
            one = self.alloc.pages_to_slots(torch.tensor([page], dtype=torch.int64))
            assert not self.alloc.is_allocated(one), f"page {page} should be free"


class SWAAllocatorMachine(RuleBasedStateMachine):
    """SWAAllocator: alloc / free / free_swa keep both pools and the mapping consistent."""

    held = Bundle("held")

    @initialize(
        page_size=st.sampled_from([1, 4, 16]), full=st.integers(1, 10), swa=st.integers(1, 6)
    )
    def setup(self, page_size: int, full: int, swa: int) -> None:
        self.ps = page_size
        self.h = SWAAllocator(
            PagedAllocator(full * page_size, page_size), PagedAllocator(swa * page_size, page_size)
        )
        self.full_held = 0
        self.swa_held: dict[int, int] = {}  # id(slots) -> mapped swa pages

    @rule(target=held, num_tokens=st.integers(1, 3 * 16))
    def alloc_tokens(self, num_tokens: int) -> torch.Tensor:
        pages = -(-num_tokens // self.ps)
        fits = (
            self.h.full_available_size() >= pages * self.ps
            and self.h.swa_available_size() >= pages * self.ps
        )
        slots = self.h.alloc(num_tokens)
        assert (slots is not None) == fits
        if slots is None:
            return torch.empty(0, dtype=torch.int64)
        self.full_held += pages
        self.swa_held[id(slots)] = pages
        return slots

    @rule(slots=held)
    def free_swa(self, slots: torch.Tensor) -> None:
        self.h.free_swa(slots)
        self.swa_held[id(slots)] = 0

    @rule(slots=consumes(held))
    def free(self, slots: torch.Tensor) -> None:
        self.h.free(slots)
        self.full_held -= slots.numel() // self.ps
        self.swa_held.pop(id(slots), None)

    @invariant()
    def accounting(self) -> None:
        h = self.h
        assert h.full_available_size() + self.full_held * self.ps == h.full_total_size()
        swa_pages = sum(self.swa_held.values())
        assert h.swa_available_size() + swa_pages * self.ps == h.swa_total_size()
        h.check_invariants()


TestPagedAllocatorMachine = PagedAllocatorMachine.TestCase
TestPagedAllocatorMachine.settings = _SETTINGS
TestSWAAllocatorMachine = SWAAllocatorMachine.TestCase
TestSWAAllocatorMachine.settings = _SETTINGS
