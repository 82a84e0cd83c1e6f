"""SWAAllocator: paired full/SWA pages, the full->SWA mapping, and all-or-nothing accounting."""

from __future__ import annotations

import pytest
import torch

from radixlink.memory import PagedAllocator, SWAAllocator

PS = 4


def _hybrid(full_pages: int = 8, swa_pages: int = 4) -> SWAAllocator:
    return SWAAllocator(PagedAllocator(full_pages * PS, PS), PagedAllocator(swa_pages * PS, PS))


def _sizes(h: SWAAllocator) -> tuple[int, int]:
    return h.full_available_size(), h.swa_available_size()


def test_constructor_validation() -> None:
    """Page sizes must match and both arguments must be PagedAllocators."""
    with pytest.raises(ValueError, match="full page_size=4 != swa page_size=2"):
        SWAAllocator(PagedAllocator(8, 4), PagedAllocator(8, 2))
    with pytest.raises(ValueError, match="two PagedAllocators"):
        SWAAllocator(PagedAllocator(8, 4), None)  # type: ignore[arg-type]


def test_alloc_maps_each_full_page_to_a_fresh_swa_page() -> None:
    """alloc takes pages from both pools and translate gives page-aligned SWA slots."""
    h = _hybrid()
    assert (h.full_total_size(), h.swa_total_size()) == (32, 16)
    full = h.alloc(6)
    assert full is not None and full.numel() == 8
    assert _sizes(h) == (24, 8)
    swa = h.translate_full_to_swa(full)
    assert bool((swa > 0).all()) and torch.unique(swa).numel() == 8
    grid = swa.view(-1, PS)
    assert torch.equal(grid - grid[:, :1], torch.arange(PS).expand_as(grid))
    assert h.swa.is_allocated(swa)
    h.check_invariants()


def test_translate_any_slots_and_unmapped_is_zero() -> None:
    """translate works per slot (not only whole pages); unmapped slots give 0."""
    h = _hybrid()
    full = h.alloc(4)
    assert full is not None
    swa = h.translate_full_to_swa(full)
    one = h.translate_full_to_swa(full[2:3])
    assert one.tolist() == swa[2:3].tolist()
    other = h.full.alloc(4)
    assert other is not None
    assert h.translate_full_to_swa(other).tolist() == [0] * 4
    assert h.translate_full_to_swa(torch.tensor([0], dtype=torch.int64)).tolist() == [0]


@pytest.mark.parametrize(
    ("slots", "match"),
    [
        (torch.tensor([36], dtype=torch.int64), r"full slots 36..36 out of range 0..35"),
        (torch.tensor([-1], dtype=torch.int64), "out of range"),
        (torch.tensor([4], dtype=torch.int32), "1-D int64 torch.Tensor"),
        ([4], "1-D int64 torch.Tensor"),
    ],
)
def test_translate_rejects_bad_slots(slots: object, match: str) -> None:
    """translate raises ValueError for out-of-range or mistyped slots."""
    with pytest.raises(ValueError, match=match):
        _hybrid().translate_full_to_swa(slots)  # type: ignore[arg-type]


def test_alloc_is_all_or_nothing() -> None:
    """When either pool is short, alloc returns None and both pools are unchanged."""
    h = _hybrid(full_pages=8, swa_pages=2)
    assert h.alloc(12) is None  # swa short
    assert _sizes(h) == (32, 8)
    h2 = _hybrid(full_pages=2, swa_pages=8)
    assert h2.alloc(12) is None  # full short
    assert _sizes(h2) == (8, 32)
    h2.check_invariants()


def test_free_releases_full_and_mapped_swa() -> None:
    """free returns the full pages and their SWA pages; the mapping is cleared."""
    h = _hybrid()
    full = h.alloc(8)
    assert full is not None
    h.free(full[:4])
    assert _sizes(h) == (28, 12)
    h.check_invariants()
    h.free(full[4:])
    assert _sizes(h) == (32, 16)
    assert h.translate_full_to_swa(full).tolist() == [0] * 8


def test_free_swa_keeps_full_and_is_idempotent() -> None:
    """free_swa drops only the SWA pages; a second call is a no-op, and free still works."""
    h = _hybrid()
    full = h.alloc(8)
    assert full is not None
    h.free_swa(full[:4])
    assert _sizes(h) == (24, 12)
    assert h.translate_full_to_swa(full[:4]).tolist() == [0] * 4
    assert h.full.is_allocated(full)
    h.free_swa(full[:4])
    assert _sizes(h) == (24, 12)
    h.check_invariants()
    h.free(full)  # frees the remaining mapped swa page of full[4:] only
    assert _sizes(h) == (32, 16)
    h.check_invariants()


def test_free_misuse_raises_and_changes_nothing() -> None:
    """Double free, foreign or unaligned full slots raise; mapping and sizes stay."""
    h = _hybrid()
    full = h.alloc(8)
    assert full is not None
    h.free(full[:4])
    before = _sizes(h)
    with pytest.raises(ValueError, match="double free"):
        h.free(full)
    with pytest.raises(ValueError, match="not page aligned"):
        h.free(full[1:5])
    with pytest.raises(ValueError, match=r"pages 9..9, valid 1..8"):
        h.free(torch.arange(36, 40, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"pages 9..9, valid 1..8"):
        h.free_swa(torch.arange(36, 40, dtype=torch.int64))
    with pytest.raises(ValueError, match="not a whole number of pages"):
        h.free_swa(full[4:6])
    assert _sizes(h) == before
    assert bool((h.translate_full_to_swa(full[4:]) > 0).all())
    h.check_invariants()


def test_set_mapping_after_alloc_swa() -> None:
    """alloc_swa + set_full_to_swa_mapping binds pages; free releases both."""
    h = _hybrid()
    full = h.full.alloc(8)
    swa = h.alloc_swa(8)
    assert full is not None and swa is not None
    assert h.translate_full_to_swa(full).tolist() == [0] * 8
    h.set_full_to_swa_mapping(full, swa)
    assert torch.equal(h.translate_full_to_swa(full), swa)
    h.check_invariants()
    h.free(full)
    assert _sizes(h) == (32, 16)


def test_set_mapping_misuse_raises() -> None:
    """Mismatched lengths, free pages, remapping or sharing an SWA page raise ValueError."""
    h = _hybrid()
    full = h.full.alloc(8)
    swa = h.alloc_swa(8)
    assert full is not None and swa is not None
    with pytest.raises(ValueError, match="8 full slots but 4 swa slots"):
        h.set_full_to_swa_mapping(full, swa[:4])
    with pytest.raises(ValueError, match="full pages are not allocated"):
        h.set_full_to_swa_mapping(torch.arange(28, 32, dtype=torch.int64), swa[:4])
    with pytest.raises(ValueError, match="swa pages are not allocated"):
        h.set_full_to_swa_mapping(full[:4], torch.arange(12, 16, dtype=torch.int64))
    with pytest.raises(ValueError, match="swa pages already mapped or repeated"):
        h.set_full_to_swa_mapping(full, torch.cat([swa[:4], swa[:4]]))
    h.set_full_to_swa_mapping(full[:4], swa[:4])
    with pytest.raises(ValueError, match="full pages already mapped; free_swa first"):
        h.set_full_to_swa_mapping(full[:4], swa[4:])
    with pytest.raises(ValueError, match="swa pages already mapped"):
        h.set_full_to_swa_mapping(full[4:], swa[:4])
    with pytest.raises(ValueError, match="full pages repeated"):
        h.set_full_to_swa_mapping(torch.cat([full[4:], full[4:]]), torch.cat([swa[4:], swa[:4]]))
    h.check_invariants()
    assert h.translate_full_to_swa(full[4:]).tolist() == [0] * 4
