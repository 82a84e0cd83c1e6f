"""``StoredPages`` (the stored index, once ``KnownPages``): the record of pages known to be in
the store. It answers which pages still need a write, trusts a confirmation for at most its age
bound, holds about ``max_pages`` pages, forgets pages the store lost, and with ``max_pages=0``
lets no write be skipped."""

from __future__ import annotations

import pytest

from radixlink.contract import PoolName
from radixlink.tree.stored import StoredPages as KnownPages

KV, SWA = PoolName.KV, PoolName.SWA


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _hashes(start: int, n: int) -> list[str]:
    return [f"{i:064x}" for i in range(start, start + n)]


def test_unknown_pages_are_the_ones_not_confirmed() -> None:
    """After confirming pages 0..3 of KV, pages 2..5 need writes for 4 and 5 only; since-time
    is when the known ones were confirmed; the same hashes in another pool are unknown (None:
    all of them)."""
    clock = Clock()
    known = KnownPages(100, 60.0, clock)
    known.add(KV, _hashes(0, 4))
    clock.now += 1
    todo, ids, since = known.unknown(KV, _hashes(2, 4))
    assert todo == [2, 3] and list(ids) == _hashes(4, 2) and since == 100.0
    assert known.unknown(SWA, _hashes(0, 2))[0] is None
    assert known.unknown(KV, _hashes(10, 2))[2] is None
    assert known.stats() == {"known_pages": 4, "known_pages_skipped": 2}


def test_confirmations_expire_after_the_age_bound() -> None:
    """A page confirmed at t is known until t + max_age at the latest, and gone after."""
    clock = Clock()
    known = KnownPages(100, 10.0, clock)
    known.add(KV, _hashes(0, 1))
    clock.now += 6  # one rotation: still known, from the previous generation
    assert known.unknown(KV, _hashes(0, 1))[0] == []
    clock.now += 5  # 11 s after it was confirmed
    assert known.unknown(KV, _hashes(0, 1))[0] is None


def test_the_record_is_bounded_and_forgets_lost_pages() -> None:
    """Past max_pages the oldest generation goes; discard forgets pages at once; a record
    of size 0 knows nothing; bad arguments are refused."""
    known = KnownPages(10, 1e9, Clock())
    for start in range(0, 40, 5):
        known.add(KV, _hashes(start, 5))
    assert len(known) <= 10
    assert known.unknown(KV, _hashes(35, 5))[0] == []
    assert known.unknown(KV, _hashes(0, 5))[0] is None
    known.discard(KV, _hashes(36, 1))
    assert known.unknown(KV, _hashes(35, 3))[0] == [1]
    off = KnownPages(0, 10.0)
    off.add(KV, _hashes(0, 3))
    assert not off.enabled and off.unknown(KV, _hashes(0, 3))[0] is None
    with pytest.raises(ValueError, match="max_known_pages"):
        KnownPages(-1, 10.0)
    with pytest.raises(ValueError, match="age bound"):
        KnownPages(10, 0.0)


def test_pools_are_kept_apart_and_counted_exactly() -> None:
    """The same hashes in two pools are two pages each; forgetting some of one pool leaves
    the other's known and the count exact, also after a rotation and with repeats."""
    clock = Clock()
    known = KnownPages(100, 10.0, clock)
    known.add(KV, _hashes(0, 4))
    known.add(SWA, _hashes(0, 4))
    known.add(KV, _hashes(0, 2))  # already known: counted once
    assert len(known) == 8
    known.discard(KV, _hashes(0, 2))
    assert len(known) == 6
    assert known.unknown(KV, _hashes(0, 4))[0] == [0, 1]
    assert known.unknown(SWA, _hashes(0, 4))[0] == []
    clock.now += 6  # rotated: the pages are in the previous generation
    known.add(KV, _hashes(10, 1))
    known.discard(SWA, _hashes(3, 1))
    assert len(known) == 6 and known.unknown(SWA, _hashes(3, 1))[0] is None
