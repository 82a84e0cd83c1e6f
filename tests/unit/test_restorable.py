"""Worked examples of restorable-prefix rules and in-process rank agreement."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from radixlink.contract import PoolHitPolicy, PoolName, PoolTransfer
from radixlink.linker import (
    LocalRankGroup,
    PoolPresence,
    RankGroup,
    largest_common,
    presence_from_store,
    restorable_prefix_pages,
    run_ranks,
)
from radixlink.pages.restore import PoolRule, restorable, split_presence, stored_past

ALL = PoolHitPolicy.ALL_PAGES
TRAIL = PoolHitPolicy.TRAILING_PAGES


def _flags(num_pages: int, pages: set[int]) -> tuple[bool, ...]:
    return tuple(i in pages for i in range(num_pages))


def full(num_pages: int, pages: set[int]) -> PoolPresence:
    return PoolPresence(name=PoolName.KV, hit_policy=ALL, present=_flags(num_pages, pages))


def swa(num_pages: int, pages: set[int], window: int, live: int | None = None) -> PoolPresence:
    return PoolPresence(
        name=PoolName.SWA,
        hit_policy=TRAIL,
        present=_flags(num_pages, pages),
        window_pages=window,
        live_pages_before=live,
    )


def mamba(num_pages: int, pages: set[int]) -> PoolPresence:
    return PoolPresence(
        name=PoolName.MAMBA, hit_policy=TRAIL, present=_flags(num_pages, pages), window_pages=1
    )


def lengths(num_pages: int, *pools: PoolPresence) -> list[int]:
    return restorable_prefix_pages(num_pages, pools).restorable_prefix_pages


@pytest.mark.parametrize(
    ("pools", "expected"),
    [
        # FULL: legal lengths are 1..first missing page.
        ([full(6, {0, 1, 2, 3})], [1, 2, 3, 4]),
        ([full(6, {1, 2, 3})], []),
        ([full(6, set(range(6)))], [1, 2, 3, 4, 5, 6]),
        # SWA w=2 {1,2}: L=3 needs pages 1..2; L=1, 2 need page 0; L=4 needs page 3.
        ([swa(6, {1, 2}, window=2)], [3]),
        ([full(6, {0, 1, 2, 3}), swa(6, {1, 2}, window=2)], [3]),
        # SWA w=2 {0,1,3,4}: L=1 (page 0), 2 (0..1), 5 (3..4); L=3, 4 miss page 2.
        ([swa(6, {0, 1, 3, 4}, window=2)], [1, 2, 5]),
        # MAMBA: exactly the lengths whose boundary state is stored (the design's {2, 5}).
        ([full(6, set(range(6))), mamba(6, {1, 4})], [2, 5]),
        ([full(6, {0, 1, 2}), mamba(6, {1, 4})], [2]),
        # FULL + SWA w=2 + MAMBA: FULL 1..5, SWA {1,2,4,5}, MAMBA {2,3,5} -> {2, 5}.
        (
            [full(6, {0, 1, 2, 3, 4}), swa(6, {0, 1, 3, 4}, window=2), mamba(6, {1, 2, 4})],
            [2, 5],
        ),
    ],
)
def test_worked_examples(pools: list[PoolPresence], expected: list[int]) -> None:
    """Each worked presence map restores at exactly the listed lengths."""
    assert lengths(6, *pools) == expected


@pytest.mark.parametrize(
    ("live", "expected"),
    [(None, [1, 2, 3]), (2, [1, 2, 3]), (1, [2, 3]), (0, [3])],
)
def test_swa_window_reaching_into_device_pages(live: int | None, expected: list[int]) -> None:
    """An SWA window reaching before page 0 is satisfied only as far as device data lives."""
    # w=3, tail pages 0..2 present: L=1 needs -2..0, L=2 needs -1..1, L=3 needs 0..2.
    assert lengths(3, swa(3, {0, 1, 2}, window=3, live=live)) == expected


def test_short_presence_counts_missing_pages_as_absent() -> None:
    """Pages past the end of a pool's presence are absent."""
    pool = PoolPresence(name=PoolName.KV, hit_policy=ALL, present=(True, True))
    assert lengths(5, pool) == [1, 2]
    assert lengths(5, mamba(1, {0})) == [1]


def test_empty_inputs_restore_nothing() -> None:
    """No pools or no pages means nothing is restorable."""
    assert lengths(4) == []
    assert lengths(0, full(0, set())) == []
    assert restorable_prefix_pages(0, []).best == 0


def test_result_best_is_largest() -> None:
    """PoolTransferResult.best is the largest restorable length."""
    assert restorable_prefix_pages(6, [full(6, set(range(6))), mamba(6, {1, 4})]).best == 5


@pytest.mark.parametrize(
    "make",
    [
        lambda: PoolPresence(name=PoolName.SWA, hit_policy=TRAIL, present=(), window_pages=0),
        lambda: PoolPresence(name=PoolName.KV, hit_policy=ALL, present=(), window_pages=2),
        lambda: swa(2, set(), window=2, live=-1),
    ],
)
def test_presence_rejects_bad_windows(make: Callable[[], PoolPresence]) -> None:
    """A trailing pool needs a window >= 1; an ALL_PAGES pool takes none."""
    with pytest.raises(ValueError, match="window|live_pages_before"):
        make()


def test_restorable_rejects_misuse() -> None:
    """Negative page counts and presence longer than the tail are caller errors."""
    with pytest.raises(ValueError, match="negative"):
        restorable_prefix_pages(-1, [])
    with pytest.raises(ValueError, match="reports 4 pages but the tail has 3"):
        restorable_prefix_pages(3, [full(4, {0})])


@pytest.mark.parametrize(
    ("per_rank", "expected"),
    [([[2, 4], [2]], 2), ([[1, 3], [2]], 0), ([[5]], 5), ([[], [1]], 0), ([[1, 2, 5]] * 3, 5)],
)
def test_largest_common(per_rank: list[list[int]], expected: int) -> None:
    """The hit is the largest length shared by every rank, never a per-rank maximum."""
    assert largest_common(per_rank) == expected


def test_stored_past_names_the_pages_a_load_never_reads() -> None:
    """Two pools of 5 pages, one run after the other: every stored page at the restore point
    or past it, in either pool (the missing page itself is not stored)."""
    kv = [True, True, False, True, True]
    swa = [False, True, True, False, True]
    assert stored_past(kv + swa, 5, 2) == [3, 4, 7, 9]
    assert stored_past(kv + swa, 5, 5) == []
    assert stored_past(kv + swa, 5, 0) == [0, 1, 3, 4, 6, 7, 9]
    assert stored_past([], 0, 0) == []


def test_largest_common_needs_a_rank() -> None:
    """Zero ranks is a caller error."""
    with pytest.raises(ValueError, match="at least one rank"):
        largest_common([])


def test_presence_from_store_splits_flat_answer() -> None:
    """A flat exists() answer splits back into per-pool presence in transfer order."""
    transfers = [
        PoolTransfer(name=PoolName.KV, keys=["a", "b", "c"]),
        PoolTransfer(name=PoolName.SWA, keys=["d", "e", "f", "g"], hit_policy=TRAIL),
        PoolTransfer(name=PoolName.MAMBA, keys=["h"], hit_policy=TRAIL),
    ]
    flat = [True, True, False, True, False, False, True, True]
    windows = {PoolName.SWA: 2, PoolName.MAMBA: 1}
    kv, sw, mb = presence_from_store(transfers, flat, window_pages=windows)
    assert (kv.name, kv.hit_policy, kv.present, kv.window_pages) == (
        PoolName.KV,
        ALL,
        (True, True, False),
        0,
    )
    assert (sw.present, sw.window_pages) == ((True, False, False, True), 2)
    assert (mb.present, mb.window_pages, mb.hit_policy) == ((True,), 1, TRAIL)


def test_presence_from_store_rejects_misuse() -> None:
    """A short answer or a trailing pool without a window is a caller error."""
    transfers = [PoolTransfer(name=PoolName.SWA, keys=["a", "b"], hit_policy=TRAIL)]
    with pytest.raises(ValueError, match="answered 1 keys"):
        presence_from_store(transfers, [True], window_pages={PoolName.SWA: 1})
    with pytest.raises(ValueError, match="no entry"):
        presence_from_store(transfers, [True, True])


def test_one_flat_answer_gives_the_rule_of_every_adapter() -> None:
    """``restorable`` (the lookup of SGLang's linker and vLLM's scheduler) is the rule over
    ``split_presence`` of one flat answer, pool after pool, each of ``num_pages`` flags."""
    rules = [PoolRule(PoolName.KV), PoolRule(PoolName.SWA, TRAIL, 2)]
    flat = [True, True, True, False, True, True, True, False]
    kv, sw = split_presence(rules, flat, [4, 4])
    assert (kv.present, sw.present, sw.window_pages) == (tuple(flat[:4]), tuple(flat[4:]), 2)
    assert restorable(rules, flat, 4) == \
        restorable_prefix_pages(4, [kv, sw]).restorable_prefix_pages == [1, 2, 3]
    with pytest.raises(ValueError, match="answered 7 keys"):
        split_presence(rules, flat[:7], [4, 4])


def test_local_rank_group_is_identity() -> None:
    """A single-process group returns its own answers."""
    group = LocalRankGroup()
    assert (group.rank, group.world_size) == (0, 1)
    assert group.intersect([2, 4], 5) == [2, 4]
    assert group.all_ok(False) is False and group.all_ok(True) is True
    assert group.agree_count(7) == 7
    assert group.all_of([True, False]) == [True, False]


def test_intersect_rejects_out_of_range_lengths() -> None:
    """Lengths outside 1..num_pages are a caller error."""
    with pytest.raises(ValueError, match="outside 1..3"):
        LocalRankGroup().intersect([4], 3)
    with pytest.raises(ValueError, match="outside 1..3"):
        LocalRankGroup().intersect([0], 3)


def test_simulated_ranks_agree() -> None:
    """Simulated ranks intersect sets, AND flags and take the MIN count, identically on all."""

    def body(group: RankGroup) -> tuple[list[int], int, bool, bool, int, list[bool]]:
        local = [[2, 4], [2], [1, 2, 4]][group.rank]
        common = group.intersect(local, 4)
        return (
            common,
            largest_common([common]) if common else 0,
            group.all_ok(group.rank != 1),
            group.all_ok(True),
            group.agree_count(10 - group.rank),
            group.all_of([True, group.rank != 1, group.rank == 2]),
        )

    results = run_ranks(3, body)
    assert results == [([2], 2, False, True, 8, [True, False, False])] * 3


def test_simulated_mismatched_sizes_raise() -> None:
    """Ranks passing different num_pages get a ValueError instead of a wrong answer."""
    with pytest.raises(ValueError, match="mismatched collective"):
        run_ranks(2, lambda g: g.intersect([1], 1 + g.rank))


def test_simulated_rank_failure_propagates_without_hanging() -> None:
    """A rank that raises instead of joining a collective fails the run promptly."""

    def body(group: RankGroup) -> bool:
        if group.rank == 0:
            raise RuntimeError("rank 0 died")
        return group.all_ok(True)

    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 0 died"):
        run_ranks(2, body, timeout_s=30.0)
    assert time.monotonic() - start < 5.0
