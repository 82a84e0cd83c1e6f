"""Where whole pages land in an SGLang pool: the slots of a load planned once, then written
per tensor either as one copy per run of consecutive slots or as one ``index_put_``.

SGLang's allocators hand out pages in ascending order from a sorted free list, so a request's
pages are mostly one or a few runs of consecutive slots. A run lands as a plain strided copy
(one pass, near memcpy speed); ``index_put_`` over per-token rows pays for its index on every
row. Each copy costs its dispatch, so runs only pay from some length on, hence the two
thresholds. Through torch (``scatter``: ~10 view ops a copy) the two met at runs of about 96
KiB per tensor (SmolLM2's 768-byte rows, 16-row pages: 1.5x faster than ``index_put_`` for one
run of 64 pages, 2.5x slower for 64 runs of one page): ``RUN_MIN_BYTES``. Through numpy views
made once (``copy_runs``: one slice and one ``copyto`` a copy) they met at runs of one page
(12 KiB per tensor: 0.81x ``index_put_``'s time for 22 such runs, 1.09x for 64), and one run of
22 pages landed in 0.24x its time: ``COPY_RUN_MIN_BYTES``. Must not import SGLang.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

RUN_MIN_BYTES = 128 << 10  # average run, per tensor, from which scatter's copies win
COPY_RUN_MIN_BYTES = 16 << 10  # the same for copy_runs


@dataclass(frozen=True, slots=True)
class SlotRuns:
    """The slots of ``num_pages`` whole pages of ``rows_per_page`` rows.

    Attributes:
        index: ``[num_pages, rows_per_page]`` int64 slots, on the pool's device.
        runs: ``(first page, pages, first slot)`` per run of pages at consecutive slots, or
            None where ``index_put_`` is the faster way (short runs, or a device pool: one
            kernel there beats a launch per run).
    """

    index: torch.Tensor
    runs: tuple[tuple[int, int, int], ...] | None

    @property
    def num_pages(self) -> int:
        return int(self.index.shape[0])

    @property
    def rows_per_page(self) -> int:
        return int(self.index.shape[1])

    @classmethod
    def plan(cls, slots: torch.Tensor, rows_per_page: int, row_bytes: int,
             device: torch.device, *, numpy: bool = False) -> SlotRuns:
        """Plan ``slots`` (any shape, whole pages) for a pool on ``device`` whose tensors
        copy ``row_bytes`` bytes per slot (the smallest of them), landed by ``copy_runs``
        (``numpy``) or by ``scatter``.

        Raises:
            ValueError: ``slots`` is not a whole number of pages.
        """
        index = page_index(slots, rows_per_page, device)
        runs = None
        if device.type == "cpu":
            runs = _runs(index, rows_per_page)
            min_bytes = COPY_RUN_MIN_BYTES if numpy else RUN_MIN_BYTES
            if runs is not None and index.numel() * row_bytes < min_bytes * len(runs):
                runs = None
        return cls(index=index, runs=runs)

    def scatter(self, dst: torch.Tensor, dim: int, data: torch.Tensor) -> None:
        """Write ``data`` into the rows of ``dst`` along ``dim`` at these slots: ``data`` is
        ``dst``'s shape with ``dim`` replaced by ``(num_pages, rows_per_page)`` (any strides;
        on ``dst``'s device, or on the CPU for ``index_put_``)."""
        if self.runs is None:
            dst[(slice(None),) * dim + (self.index,)] = data.to(dst.device)
            return
        rows = self.rows_per_page
        for first, count, start in self.runs:
            _copy(dst.narrow(dim, start, count * rows).unflatten(dim, (count, rows)),
                  data.narrow(dim, first, count))

    def copy_runs(self, targets: Sequence[tuple[np.ndarray, int]], pages: np.ndarray, *,
                  into_slots: bool = True) -> None:
        """Copy whole pages between ``pages`` and slot rows by runs (``runs`` must not be
        None), in numpy on this thread: for each ``(rows, offset)`` target, a tensor's slots
        as ``byte_rows`` gives them, the bytes of each page from ``offset`` on, one row after
        another, are that page's slots' rows (written into the slots, or read from them).

        One slice and one ``copyto`` per run and tensor: a chunk of SmolLM2 (30 layers, K and
        V) is 60 copies, and ~10 torch view ops around each one held the GIL the next chunk's
        read needs between its syscalls.

        Args:
            targets: ``(uint8 [slots, row_bytes] rows, byte offset of their rows in a page)``.
            pages: ``uint8 [num_pages, page_bytes]`` (rows may be spaced: staging frames).
            into_slots: write the pages into the slots (a load), else read them (an offload).
        """
        assert self.runs is not None, "copy_runs needs runs; index_put_ places the rest"
        per_page = self.rows_per_page
        for first, count, start in self.runs:
            page_rows = pages[first : first + count]
            lo, hi = start, start + count * per_page  # NOTE: start is a slot
            for rows, offset in targets:
                width = rows.shape[1] * per_page
                slot_bytes = rows[lo:hi].reshape(count, width)
                page_bytes = page_rows[:, offset : offset + width]
                if into_slots:
                    np.copyto(slot_bytes, page_bytes)
                else:
                    np.copyto(page_bytes, slot_bytes)


def byte_rows(tensor: torch.Tensor) -> np.ndarray | None:
    """A CPU tensor whose dim 0 is the slot as ``uint8 [slots, row_bytes]`` numpy (a view of
    its memory, made once), or None where ``copy_runs`` cannot write it (a device tensor,
    rows that are not dense)."""
    if tensor.device.type != "cpu" or tensor.dim() == 0 or not tensor.is_contiguous():
        return None
    try:
        return tensor.view(torch.uint8).reshape(tensor.shape[0], -1).numpy()
    except (RuntimeError, TypeError):  # NOTE: a dtype numpy refuses even as bytes
        return None


def page_index(slots: torch.Tensor, rows_per_page: int, device: torch.device) -> torch.Tensor:
    """``slots`` (any shape) as ``[num_pages, rows_per_page]`` int64 on ``device``.

    Raises:
        ValueError: ``slots`` is not a whole number of pages.
    """
    flat = slots.reshape(-1)
    if flat.numel() == 0 or flat.numel() % rows_per_page:
        raise ValueError(f"{flat.numel()} slots is not a whole number of {rows_per_page}-slot "
                         "pages")
    return flat.to(device, torch.int64).view(-1, rows_per_page)


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` for CPU tensors, on this thread alone: as bytes through numpy,
    which takes no OpenMP team. From a radixlink thread inside SGLang's CPU engine, torch's
    copy handed each run to an OpenMP team of two and took twice as long (16 MiB landed in
    5.4-7 ms against 2.8-3.1 ms, measured in the engine; a plain process shows no gap)."""
    try:
        np.copyto(dst.view(torch.uint8).numpy(), src.view(torch.uint8).numpy())
    except (RuntimeError, TypeError):  # NOTE: a last dim with a stride, or a tensor numpy refuses
        dst.copy_(src)


def typed(pages: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """``uint8 [num_pages, nbytes]`` page bytes (rows may be spaced, as staging frames are)
    as ``shape`` of ``dtype``: a view where the spacing and alignment allow, else a contiguous
    copy."""
    try:
        return pages.view(dtype).view(shape)
    except RuntimeError:  # NOTE: a spacing or offset the dtype does not divide
        return pages.contiguous().view(dtype).view(shape)


def _runs(index: torch.Tensor, rows_per_page: int) -> tuple[tuple[int, int, int], ...] | None:
    """Runs of pages whose slots continue one another, or None where a page's own rows are
    not consecutive (then only ``index_put_`` places them). In numpy: a chunk of a streamed
    load plans its slots on the thread that lands it."""
    at = index.numpy()
    if rows_per_page > 1 and not bool(
        (at[:, 1:] == at[:, :1] + np.arange(1, rows_per_page)).all()
    ):
        return None
    first = at[:, 0]
    breaks = (np.flatnonzero(first[1:] != first[:-1] + rows_per_page) + 1).tolist()
    bounds = [0, *breaks, len(first)]
    starts = first[bounds[:-1]].tolist()
    return tuple((a, b - a, s) for a, b, s in zip(bounds[:-1], bounds[1:], starts))
