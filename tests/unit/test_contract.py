"""The public contract: names, frozen records, and adopted-range bookkeeping."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixlink.contract import (
    ComponentType,
    ExternalLinkerLoadPhase,
    InsertParams,
    InsertResult,
    LinkerTransferPhase,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)


def test_enum_members_are_exactly_the_design_names() -> None:
    """The enums carry exactly the members DESIGN.md section 3 names."""
    assert [m.name for m in ComponentType] == ["FULL", "SWA", "MAMBA"]
    assert [m.name for m in PoolName] == ["KV", "SWA", "MAMBA"]
    assert [m.name for m in PoolHitPolicy] == ["ALL_PAGES", "TRAILING_PAGES"]
    assert [m.name for m in LinkerTransferPhase] == ["LOOKUP", "LOAD", "OFFLOAD"]
    assert [m.name for m in ExternalLinkerLoadPhase] == ["PREPARE", "COMMIT", "ABORT"]
    assert LinkerTransferPhase.LOAD == "load"


def test_boundary_records_are_frozen_and_keyword_only() -> None:
    """PoolTransfer and InsertParams cannot be mutated or built positionally."""
    transfer = PoolTransfer(name=PoolName.KV, keys=["a"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        transfer.keys = []  # type: ignore[misc]
    with pytest.raises(TypeError):
        PoolTransfer(PoolName.KV, ["a"])  # type: ignore[misc]
    params = InsertParams(key=[1, 2], value=torch.arange(2))
    assert params.prev_prefix_len == 0 and params.track_adopted_ranges is False


def test_transfer_result_best_is_the_largest_length() -> None:
    """best is the last (largest) restorable length, 0 when there is none."""
    assert PoolTransferResult(restorable_prefix_pages=[2, 5]).best == 5
    assert PoolTransferResult(restorable_prefix_pages=[]).best == 0


@pytest.mark.parametrize(
    ("ranges", "expected"),
    [
        ([(0, 16), (16, 32)], [(0, 32)]),  # touching ranges merge
        ([(0, 16), (8, 24)], [(0, 24)]),  # overlapping ranges merge
        ([(0, 16), (32, 48)], [(0, 16), (32, 48)]),  # a gap keeps them apart
        ([(16, 32), (0, 16)], [(0, 32)]),  # touching from below merges too
        ([(0, 16), (16, 16)], [(0, 16)]),  # empty ranges are ignored
        # out of order (#13.9: this reported 28 adopted tokens for 20)
        ([(8, 16), (0, 4), (4, 8), (20, 24), (12, 22)], [(0, 24)]),
        ([(24, 28), (0, 4), (8, 12), (2, 10)], [(0, 12), (24, 28)]),
    ],
)
def test_record_adopted_range_merges_touching_ranges(ranges, expected) -> None:
    """record_adopted_range keeps ranges sorted and disjoint, merging any it touches or
    overlaps, whatever the order they come in; adopted_tokens counts each token once."""
    result = InsertResult(prefix_len=0)
    for start, end in ranges:
        result.record_adopted_range(ComponentType.FULL, start, end)
    assert result.adopted_ranges[ComponentType.FULL] == expected
    assert result.adopted_tokens(ComponentType.FULL) == sum(e - s for s, e in expected)
    assert result.adopted_tokens(ComponentType.SWA) == 0


@pytest.mark.parametrize(("start", "end"), [(-16, 0), (32, 16)])
def test_record_adopted_range_rejects_bad_ranges(start: int, end: int) -> None:
    """Negative or reversed ranges raise ValueError naming the numbers."""
    result = InsertResult(prefix_len=0)
    with pytest.raises(ValueError, match=str(end)):
        result.record_adopted_range(ComponentType.SWA, start, end)
    assert result.adopted_ranges == {}
