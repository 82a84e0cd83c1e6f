"""Random presence maps over 1-4 simulated ranks agree with a brute-force oracle."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from radixlink.contract import PoolHitPolicy, PoolName, PoolTransfer
from radixlink.linker import (
    PoolPresence,
    RankGroup,
    largest_common,
    presence_from_store,
    restorable_prefix_pages,
    run_ranks,
)

_NAMES = [PoolName.KV, PoolName.SWA, PoolName.MAMBA]


@dataclass(frozen=True)
class PoolShape:
    """A pool's policy, shared by every rank (presence differs per rank)."""

    policy: PoolHitPolicy
    window: int
    live: int | None


@st.composite
def worlds(draw: st.DrawFn) -> tuple[int, list[PoolShape], list[list[list[bool]]]]:
    """num_pages, pool shapes, and presence[rank][pool][page] (possibly short)."""
    num_pages = draw(st.integers(0, 8))
    shapes = []
    for _ in range(draw(st.integers(1, 4))):
        trailing = draw(st.booleans())
        shapes.append(
            PoolShape(
                policy=PoolHitPolicy.TRAILING_PAGES if trailing else PoolHitPolicy.ALL_PAGES,
                window=draw(st.integers(1, 4)) if trailing else 0,
                live=draw(st.none() | st.integers(0, 3)) if trailing else None,
            )
        )
    num_ranks = draw(st.integers(1, 4))
    # NOTE: mostly-present pages, so that long restorable lengths actually occur.
    page = st.sampled_from([True, True, True, False])
    presence = [
        [draw(st.lists(page, min_size=0, max_size=num_pages)) for _ in shapes]
        for _ in range(num_ranks)
    ]
    return num_pages, shapes, presence


def _oracle(num_pages: int, shapes: list[PoolShape], presence: list[list[bool]]) -> set[int]:
    """Obviously-correct rule: check every required page of every pool for every length."""
    out = set()
    for length in range(1, num_pages + 1):
        ok = True
        for shape, flags in zip(shapes, presence, strict=True):
            first = 0 if shape.policy is PoolHitPolicy.ALL_PAGES else length - shape.window
            for page in range(first, length):
                if page >= 0:
                    held = page < len(flags) and flags[page]
                else:  # a device-cached page before the tail
                    held = shape.live is None or -page <= shape.live
                ok = ok and held
        if ok:
            out.add(length)
    return out


def _presences(shapes: list[PoolShape], flags: list[list[bool]]) -> list[PoolPresence]:
    return [
        PoolPresence(
            name=_NAMES[i % 3],
            hit_policy=s.policy,
            present=tuple(f),
            window_pages=s.window,
            live_pages_before=s.live,
        )
        for i, (s, f) in enumerate(zip(shapes, flags, strict=True))
    ]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(worlds())
def test_restorable_and_rank_intersection_match_oracle(
    world: tuple[int, list[PoolShape], list[list[list[bool]]]],
) -> None:
    """Per-rank restorable sets and their rank intersection equal the brute-force oracle."""
    num_pages, shapes, presence = world
    expected_local = [_oracle(num_pages, shapes, per_rank) for per_rank in presence]
    expected_common = set.intersection(*expected_local)

    def body(group: RankGroup) -> tuple[list[int], list[int]]:
        pools = _presences(shapes, presence[group.rank])
        local = restorable_prefix_pages(num_pages, pools).restorable_prefix_pages
        return local, group.intersect(local, num_pages)

    results = run_ranks(len(presence), body)
    for (local, common), expected in zip(results, expected_local, strict=True):
        assert local == sorted(expected)
        assert common == sorted(expected_common)
    assert largest_common([local for local, _ in results]) == max(expected_common, default=0)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.lists(st.booleans(), max_size=6), min_size=1, max_size=4))
def test_presence_from_store_round_trips(per_pool: list[list[bool]]) -> None:
    """Splitting a concatenated exists() answer gives back each pool's flags in order."""
    transfers = [
        PoolTransfer(
            name=_NAMES[i % 3],
            keys=[f"{i}/{j}" for j in range(len(flags))],
            hit_policy=PoolHitPolicy.TRAILING_PAGES if i % 2 else PoolHitPolicy.ALL_PAGES,
        )
        for i, flags in enumerate(per_pool)
    ]
    flat = [flag for flags in per_pool for flag in flags]
    windows = {name: 2 for name in _NAMES}
    split = presence_from_store(transfers, flat, window_pages=windows)
    assert [list(p.present) for p in split] == per_pool
    assert [p.hit_policy for p in split] == [t.hit_policy for t in transfers]
