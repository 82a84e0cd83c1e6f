"""Rank agreement across tensor-parallel ranks: one MIN all-reduce primitive and ops built on it.

Owns the collectives the linker needs. Must not touch stores, the tree or restorable rules.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

T = TypeVar("T")


class RankGroup(ABC):
    """Agreement among the ranks that serve one request.

    Every method is a collective: every rank of the group must call it, in the same order,
    with the same ``num_pages`` / vector length, or the group hangs (torch.distributed) or
    raises (simulated). Subclasses implement ``all_reduce_min``; the rest is derived.
    """

    @property
    @abstractmethod
    def rank(self) -> int:
        """This process's rank in the group, 0-based."""

    @property
    @abstractmethod
    def world_size(self) -> int:
        """Number of ranks in the group."""

    @abstractmethod
    def all_reduce_min(self, values: Sequence[int]) -> list[int]:
        """Element-wise MIN of ``values`` over all ranks (a collective; same length on all)."""

    def intersect(self, lengths: Sequence[int], num_pages: int) -> list[int]:
        """The lengths every rank can restore, ascending (a collective).

        Each rank sends a 0/1 mask over lengths 0..num_pages; the MIN is the intersection.

        Args:
            lengths: this rank's restorable prefix lengths, each in 1..num_pages.
            num_pages: the tail's whole pages (the same on every rank).

        Raises:
            ValueError: for a negative ``num_pages`` or a length outside 1..num_pages.
        """
        mask = _lengths_to_mask(lengths, num_pages)
        return [n for n, bit in enumerate(self.all_reduce_min(mask)) if bit]

    def all_ok(self, flag: bool) -> bool:
        """True iff ``flag`` is True on every rank (a collective AND)."""
        return self.all_reduce_min([1 if flag else 0])[0] == 1

    def agree_count(self, n: int) -> int:
        """The smallest ``n`` over all ranks (a collective MIN)."""
        return self.all_reduce_min([n])[0]

    def all_of(self, flags: Sequence[bool]) -> list[bool]:
        """Element-wise AND of ``flags`` over all ranks (a collective; the identity with one
        rank): several agreed yes/no answers in one all-reduce."""
        if self.world_size == 1:
            return list(flags)
        return [bit == 1 for bit in self.all_reduce_min([1 if flag else 0 for flag in flags])]

    def any_of(self, flags: Sequence[bool]) -> list[bool]:
        """Element-wise OR of ``flags`` over all ranks (a collective; the identity with one
        rank): e.g. a deadline passed on any rank passed on all."""
        if self.world_size == 1:
            return list(flags)
        return [not ok for ok in self.all_reduce_min([0 if flag else 1 for flag in flags])]


def _lengths_to_mask(lengths: Sequence[int], num_pages: int) -> list[int]:
    if num_pages < 0:
        raise ValueError(f"num_pages={num_pages} is negative; pass the tail's whole pages")
    mask = [0] * (num_pages + 1)
    for n in lengths:
        if not 1 <= n <= num_pages:
            raise ValueError(
                f"restorable length {n} is outside 1..{num_pages}; pass lengths from "
                "restorable_prefix_pages for the same num_pages"
            )
        mask[n] = 1
    return mask


class LocalRankGroup(RankGroup):
    """A single process: every collective is the identity. The default."""

    @property
    def rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    def all_reduce_min(self, values: Sequence[int]) -> list[int]:
        return list(values)


class TorchRankGroup(RankGroup):
    """Ranks of a ``torch.distributed`` process group (gloo on CPU, NCCL on GPU).

    With an NCCL group the reduced tensor lives on the current CUDA device; otherwise on CPU.
    ``torch.distributed`` must be initialised before construction.

    Args:
        process_group: the group to agree in; None means the default (world) group.

    Raises:
        ValueError: when ``torch.distributed`` is unavailable or not initialised.
    """

    def __init__(self, process_group: Any = None) -> None:
        dist = torch.distributed
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError(
                "TorchRankGroup needs an initialised torch.distributed; call "
                "torch.distributed.init_process_group(...) first, or use LocalRankGroup"
            )
        self._group = process_group
        self._rank = dist.get_rank(process_group)
        self._world_size = dist.get_world_size(process_group)
        backend = str(dist.get_backend(process_group)).lower()
        self._device = (
            torch.device("cuda", torch.cuda.current_device())
            if backend == "nccl"
            else torch.device("cpu")
        )

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def device(self) -> torch.device:
        """Where the reduced tensors live (CUDA for NCCL, else CPU)."""
        return self._device

    def all_reduce_min(self, values: Sequence[int]) -> list[int]:
        tensor = torch.tensor(list(values), dtype=torch.int64, device=self._device)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MIN, group=self._group)
        return [int(x) for x in tensor.tolist()]


class SimulatedWorld:
    """N simulated ranks in one process, one thread each (for tests and examples).

    ``group(r)`` is rank r's ``RankGroup``; run each rank's code in its own thread (see
    ``run_ranks``). Collectives meet at a barrier, so they behave like real ones: a rank that
    skips a collective makes the others fail after ``timeout_s`` (``BrokenBarrierError``).

    Raises:
        ValueError: for ``world_size`` < 1.
    """

    def __init__(self, world_size: int, timeout_s: float = 10.0) -> None:
        if world_size < 1:
            raise ValueError(f"world_size={world_size}; a world needs at least one rank")
        self.world_size = world_size
        self._barrier = threading.Barrier(world_size, timeout=timeout_s)
        self._inputs: list[list[int]] = [[] for _ in range(world_size)]
        self._result: list[int] | None = None
        self._error: str | None = None

    def group(self, rank: int) -> RankGroup:
        """Rank ``rank``'s view of this world."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank={rank} is outside 0..{self.world_size - 1}")
        return _SimulatedRankGroup(self, rank)

    def abort(self) -> None:
        """Break the barrier: every rank waiting in a collective raises ``BrokenBarrierError``."""
        self._barrier.abort()

    def _all_reduce_min(self, rank: int, values: Sequence[int]) -> list[int]:
        self._inputs[rank] = list(values)
        if self._barrier.wait() == 0:  # one rank reduces while the others wait
            sizes = {len(v) for v in self._inputs}
            self._error = None if len(sizes) == 1 else f"ranks sent sizes {sorted(sizes)}"
            if self._error is None:
                self._result = [min(col) for col in zip(*self._inputs, strict=True)]
        # NOTE: a rank reads the result before it can enter the next collective, and that
        # collective's reducer runs only after every rank has arrived, so two waits suffice.
        self._barrier.wait()
        if self._error is not None:
            raise ValueError(f"mismatched collective: {self._error}; pass the same num_pages")
        assert self._result is not None, "simulated all-reduce finished without a result"
        return list(self._result)


class _SimulatedRankGroup(RankGroup):
    def __init__(self, world: SimulatedWorld, rank: int) -> None:
        self._world = world
        self._rank = rank

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world.world_size

    def all_reduce_min(self, values: Sequence[int]) -> list[int]:
        return self._world._all_reduce_min(self._rank, values)


def run_ranks(world_size: int, fn: Callable[[RankGroup], T], timeout_s: float = 10.0) -> list[T]:
    """Run ``fn(group)`` for every rank of a fresh ``SimulatedWorld``, one thread per rank.

    Returns:
        Each rank's return value, by rank.

    Raises:
        The first exception any rank raised (by rank order).
    """
    world = SimulatedWorld(world_size, timeout_s)
    results: list[Any] = [None] * world_size
    errors: list[BaseException | None] = [None] * world_size

    def _target(rank: int) -> None:
        try:
            results[rank] = fn(world.group(rank))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread below
            errors[rank] = exc
            world.abort()  # NOTE: wakes the other ranks at once instead of after timeout_s

    threads = [threading.Thread(target=_target, args=(r,), daemon=True) for r in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    first = next((e for e in errors if e is not None and not _is_broken(e)), None)
    first = first or next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results


def _is_broken(exc: BaseException) -> bool:
    return isinstance(exc, threading.BrokenBarrierError)
