"""``RecordingGroup``: a rank group that records each collective as (kind, size), so tests can
check that every rank made the same collectives in the same order (issue #44's ranks fuzz and
D1's regression tests). Owns nothing of the library."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from radixlink.linker import RankGroup


class RecordingGroup(RankGroup):
    """A rank group that records each collective as (kind, size) before taking part."""

    def __init__(self, inner: RankGroup):
        self.inner = inner
        self.calls: list[tuple[str, int]] = []
        self._kind = "all_reduce_min"

    @property
    def rank(self) -> int:
        return self.inner.rank

    @property
    def world_size(self) -> int:
        return self.inner.world_size

    def all_reduce_min(self, values: Sequence[int]) -> list[int]:
        self.calls.append((self._kind, len(values)))
        self._kind = "all_reduce_min"
        return self.inner.all_reduce_min(values)

    def _as(self, kind: str, call: Callable[..., Any], *args: Any) -> Any:
        self._kind = kind
        try:
            return call(*args)
        finally:
            self._kind = "all_reduce_min"

    def intersect(self, lengths: Sequence[int], num_pages: int) -> list[int]:
        return self._as("intersect", super().intersect, lengths, num_pages)

    def all_ok(self, flag: bool) -> bool:
        return self._as("all_ok", super().all_ok, flag)

    def agree_count(self, n: int) -> int:
        return self._as("agree_count", super().agree_count, n)

    def all_of(self, flags: Sequence[bool]) -> list[bool]:
        return self._as("all_of", super().all_of, flags)

    def any_of(self, flags: Sequence[bool]) -> list[bool]:
        return self._as("any_of", super().any_of, flags)
