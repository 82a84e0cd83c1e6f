"""PagedAllocator: whole-page allocation, exact accounting, and refusal of every misuse."""

from __future__ import annotations

import pytest
import torch

from radixlink.memory import PagedAllocator


def _slots(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


@pytest.mark.parametrize(
    ("num_tokens", "page_size", "match"),
    [
        (16, 0, "page_size must be a positive int, got 0"),
        (16, -4, "got -4"),
        (16, True, "got True"),
        (16, 2.0, "got 2.0"),
        (0, 4, "num_tokens must be a positive int, got 0"),
        (18, 4, "num_tokens=18 is not a multiple of page_size=4; use 16"),
        (3, 4, "num_tokens=3 is not a multiple of page_size=4; use 4"),
    ],
)
def test_constructor_rejects_bad_sizes(num_tokens: int, page_size: int, match: str) -> None:
    """Non-positive, non-int or misaligned sizes raise ValueError naming the value."""
    with pytest.raises(ValueError, match=match):
        PagedAllocator(num_tokens, page_size)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_alloc_rounds_up_to_whole_aligned_pages(page_size: int) -> None:
    """alloc(n) hands out ceil(n / page_size) whole, page-aligned pages."""
    alloc = PagedAllocator(8 * page_size, page_size)
    slots = alloc.alloc(page_size + 1)
    assert slots is not None and slots.dtype == torch.int64
    assert slots.numel() == 2 * page_size
    grid = slots.view(-1, page_size)
    assert torch.equal(grid - grid[:, :1], torch.arange(page_size).expand_as(grid))
    assert bool((grid[:, 0] % page_size == 0).all())
    assert alloc.available_size() == 6 * page_size
    assert alloc.is_allocated(slots)


def test_sizes_and_num_slots() -> None:
    """num_slots counts the padding page; total excludes it; alloc(0) is empty."""
    alloc = PagedAllocator(12, 4)
    assert (alloc.num_pages, alloc.num_slots, alloc.total_size()) == (3, 16, 12)
    assert alloc.available_size() == 12 and alloc.can_alloc(12) and not alloc.can_alloc(13)
    empty = alloc.alloc(0)
    assert empty is not None and empty.numel() == 0
    alloc.free(empty)
    assert alloc.available_size() == 12


@pytest.mark.parametrize("page_size", [1, 4])
def test_slot_zero_page_never_handed_out(page_size: int) -> None:
    """Allocating everything never returns a slot of padding page 0."""
    alloc = PagedAllocator(5 * page_size, page_size)
    got = [alloc.alloc(page_size) for _ in range(5)]
    slots = torch.cat([s for s in got if s is not None])
    assert slots.numel() == 5 * page_size
    assert int(slots.min()) >= page_size and int(slots.max()) < alloc.num_slots
    assert torch.unique(slots).numel() == slots.numel()


def test_alloc_returns_none_when_short_never_partial() -> None:
    """A request larger than what is free returns None and allocates nothing."""
    alloc = PagedAllocator(16, 4)
    first = alloc.alloc(8)
    assert first is not None
    assert alloc.alloc(9) is None
    assert alloc.available_size() == 8
    assert alloc.alloc(8) is not None and alloc.available_size() == 0
    assert alloc.alloc(1) is None


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4"])
def test_alloc_rejects_bad_counts(bad: object) -> None:
    """alloc/can_alloc of a negative or non-int count raise ValueError naming it."""
    alloc = PagedAllocator(16, 4)
    with pytest.raises(ValueError, match=repr(bad)):
        alloc.alloc(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=repr(bad)):
        alloc.can_alloc(bad)  # type: ignore[arg-type]


def test_free_returns_pages_for_reuse() -> None:
    """Freed pages are available again and are handed out again."""
    alloc = PagedAllocator(8, 4)
    slots = alloc.alloc(8)
    assert slots is not None
    alloc.free(slots[:4])
    assert alloc.available_size() == 4 and not alloc.is_allocated(slots[:4])
    again = alloc.alloc(4)
    assert again is not None and torch.equal(again, slots[:4])


def test_double_free_raises_and_changes_nothing() -> None:
    """Freeing a free page raises ValueError naming the page; accounting is unchanged."""
    alloc = PagedAllocator(16, 4)
    slots = alloc.alloc(8)
    assert slots is not None
    alloc.free(slots[:4])
    page = int(slots[0]) // 4
    with pytest.raises(ValueError, match=rf"double free of pages \[{page}\]"):
        alloc.free(slots)
    assert alloc.available_size() == 12 and alloc.is_allocated(slots[4:])


def test_free_of_page_repeated_in_one_call_raises() -> None:
    """The same page twice in one free is a double free."""
    alloc = PagedAllocator(16, 4)
    slots = alloc.alloc(4)
    assert slots is not None
    with pytest.raises(ValueError, match="repeated in one call"):
        alloc.free(torch.cat([slots, slots]))
    assert alloc.available_size() == 12


@pytest.mark.parametrize(
    ("slots", "match"),
    [
        (_slots(5, 6, 7, 8), "not page aligned"),
        (_slots(4, 5, 6), "3 slots is not a whole number of pages"),
        (_slots(4, 6, 5, 7), "not page aligned"),
        (_slots(0, 1, 2, 3), r"outside the allocator \(pages 0..0, valid 1..4\)"),
        (_slots(20, 21, 22, 23), r"pages 5..5, valid 1..4"),
        (_slots(-4, -3, -2, -1), "outside the allocator"),
        (_slots(4, 5, 6, 7, 20, 21, 22, 23), r"pages 1..5, valid 1..4"),
        (_slots(4, 5, 6, 7, 9, 10, 11, 12), "not page aligned"),
        (_slots(4, 5, 6, 7, 8, 9, 10), "7 slots is not a whole number of pages"),
        (torch.tensor([4, 5, 6, 7], dtype=torch.int32), "must be int64, got torch.int32"),
        (torch.arange(4, 8).view(2, 2), r"must be 1-D, got shape \(2, 2\)"),
        ([4, 5, 6, 7], "must be a torch.Tensor of int64, got list"),
    ],
)
def test_free_rejects_malformed_or_foreign_slots(slots: object, match: str) -> None:
    """Unaligned, partial, padding, out-of-range, mistyped slots raise; nothing is freed."""
    alloc = PagedAllocator(16, 4)
    held = alloc.alloc(16)
    assert held is not None
    with pytest.raises(ValueError, match=match):
        alloc.free(slots)  # type: ignore[arg-type]
    assert alloc.available_size() == 0


def test_free_of_strided_1d_view() -> None:
    """A non-contiguous 1-D slot view (stride 2 over a 2-D tensor) is accepted."""
    alloc = PagedAllocator(16, 2)
    slots = alloc.alloc(4)
    assert slots is not None
    wide = torch.stack([slots, torch.zeros_like(slots)], dim=1)  # [4, 2]
    column = wide[:, 0]
    assert not column.is_contiguous()
    alloc.free(column)
    assert alloc.available_size() == 16


@pytest.mark.parametrize("page_size", [1, 4])
def test_multi_page_double_free_changes_nothing(page_size: int) -> None:
    """A multi-page free with one free page inside raises and frees none of the others."""
    alloc = PagedAllocator(8 * page_size, page_size)
    slots = alloc.alloc(3 * page_size)
    assert slots is not None
    alloc.free(slots[page_size : 2 * page_size])
    with pytest.raises(ValueError, match="double free of pages"):
        alloc.free(slots)
    assert alloc.available_size() == 6 * page_size
    assert alloc.is_allocated(slots[:page_size]) and alloc.is_allocated(slots[2 * page_size :])


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_free_trusted_returns_pages_like_free(page_size: int) -> None:
    """free_trusted of held pages frees them exactly as free does (LIFO reuse included)."""
    alloc = PagedAllocator(8 * page_size, page_size)
    slots = alloc.alloc(5 * page_size)
    assert slots is not None
    alloc.free_trusted(slots[2 * page_size :])
    alloc.free_trusted(slots[:0])
    assert alloc.available_size() == 6 * page_size
    assert alloc.is_allocated(slots[: 2 * page_size])
    assert not alloc.is_allocated(slots[2 * page_size : 3 * page_size])
    again = alloc.alloc(3 * page_size)
    assert again is not None and torch.equal(again, slots[2 * page_size :])


def test_free_trusted_refuses_free_and_padding_pages() -> None:
    """free_trusted asserts (changing nothing) on a free page or the padding page 0."""
    alloc = PagedAllocator(16, 4)
    slots = alloc.alloc(8)
    assert slots is not None
    alloc.free_trusted(slots[:4])
    for bad in (slots, _slots(0, 1, 2, 3)):
        with pytest.raises(AssertionError, match="free or padding"):
            alloc.free_trusted(bad)
        assert alloc.available_size() == 12 and alloc.is_allocated(slots[4:])


def test_returned_slots_do_not_alias_the_free_list() -> None:
    """Writing into slot tensors from alloc or slots_to_pages never corrupts the allocator."""
    alloc = PagedAllocator(16, 4)
    first = alloc.alloc(8)
    assert first is not None
    kept = first.clone()
    first.fill_(0)
    alloc.slots_to_pages(kept).fill_(0)
    alloc.free(kept)
    second = alloc.alloc(16)
    assert second is not None
    assert sorted((second[::4] // 4).tolist()) == [1, 2, 3, 4]


def test_is_allocated_is_false_for_foreign_slots() -> None:
    """is_allocated answers False (not an error) for padding or out-of-range pages."""
    alloc = PagedAllocator(8, 4)
    assert alloc.alloc(8) is not None
    assert not alloc.is_allocated(_slots(0, 1, 2, 3))
    assert not alloc.is_allocated(_slots(12, 13, 14, 15))
    assert alloc.is_allocated(_slots(4, 5, 6, 7, 8, 9, 10, 11))


def test_pages_and_slots_round_trip() -> None:
    """pages_to_slots and slots_to_pages are inverse on whole pages."""
    alloc = PagedAllocator(32, 4)
    pages = torch.tensor([3, 1, 7], dtype=torch.int64)
    slots = alloc.pages_to_slots(pages)
    assert slots.tolist() == [12, 13, 14, 15, 4, 5, 6, 7, 28, 29, 30, 31]
    assert torch.equal(alloc.slots_to_pages(slots), pages)


def test_device_is_normalised() -> None:
    """The allocator reports the device of the slots it hands out."""
    alloc = PagedAllocator(8, 4, device="cpu")
    slots = alloc.alloc(4)
    assert slots is not None and slots.device == alloc.device == torch.device("cpu")


@pytest.mark.gpu
def test_cuda_slots_match_allocator_device() -> None:
    """On 'cuda' (no index) the allocator accepts back the slots it handed out."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    alloc = PagedAllocator(16, 4, device="cuda")
    slots = alloc.alloc(8)
    assert slots is not None and slots.device == alloc.device
    alloc.free(slots)
    assert alloc.available_size() == 16
