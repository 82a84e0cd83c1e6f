"""Device K/V pools: paged K/V tensors (full attention and SWA) and batched page gather/scatter,
and ``PagePool``, the byte-I/O protocol every pool keeps (K/V pages here, states in states.py).

Owns the K/V tensors and their byte-exact page export and import. Knows nothing of the tree,
of allocation policy (see allocator.py), of state slots (states.py) or of stores.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from radixlink.memory.host import check_bytes, host_empty, sync, to_device
from radixlink.memory.layout import KVLayout
from radixlink.memory.states import MambaStatePool

__all__ = ["KVPool", "MambaStatePool", "PagePool"]  # MambaStatePool: for existing imports

_UINT8 = torch.uint8
# NOTE: scatter/gather move rows as the widest element type that divides a row; on CPU
# index_copy_ runs one element at a time, so 16-byte elements cut its per-element overhead ~8x.
_WIDE_DTYPES = (torch.complex128, torch.int64, torch.int32, torch.int16, torch.uint8)


def _widest_dtype(row_bytes: int) -> torch.dtype:
    return next(dt for dt in _WIDE_DTYPES if row_bytes % dt.itemsize == 0)


_SMALL_BYTES = 1 << 18  # gathers up to this size run in numpy (call overhead), larger in torch


def _np_index(pages: torch.Tensor | np.ndarray) -> np.ndarray:
    """Page ids as a numpy index (a CPU tensor's view, no copy)."""
    return pages if isinstance(pages, np.ndarray) else pages.numpy()


def _torch_index(pages: torch.Tensor | np.ndarray) -> torch.Tensor:
    return torch.from_numpy(pages) if isinstance(pages, np.ndarray) else pages


class PagePool(Protocol):
    """What moves a pool's pages as bytes, whatever a page is (a page of K/V, a state): the one
    protocol the linker's page I/O calls, so it never asks which kind of pool it has.

    Ids and slots are the tree's (distinct, valid): no checks. On CUDA the copies are only
    queued on the current stream.
    """

    num_pages: int  # ids below this (0 is padding): the pool's capacity in pages
    replicated: bool  # identical on every tensor-parallel rank (written by rank 0 only)

    @property
    def page_bytes(self) -> int:
        """Payload bytes of one page (one state)."""

    @property
    def token_bytes(self) -> int:
        """Bytes one token of a prefix brings in this pool (0: per prefix, not per token)."""

    @property
    def land_layers(self) -> int:
        """Layers a load can land one at a time (0: it lands whole, before layer 0)."""

    def page_ids(self, slots: torch.Tensor) -> Any:
        """The page ids of slots the tree handed out (whole pages, or state slots)."""

    def gather(self, pages: Any, out: torch.Tensor) -> None:
        """Copy pages out into the rows of host uint8 ``out`` (rows may be spaced)."""

    def stage(self, buf: torch.Tensor) -> torch.Tensor:
        """Pages (uint8 rows) as ``scatter`` reads them fastest; stage once, then scatter."""

    def scatter(self, pages: Any, buf: torch.Tensor, layer: int | None = None) -> None:
        """Write the rows of ``buf`` into ``pages`` (one layer, or all with None)."""


class KVPool:
    """K/V tensors of one pool, indexed by slot; also serves as the SWA pool.

    Storage is one tensor ``[2, num_layers, num_slots, num_kv_heads, head_dim]`` (K then V).
    Slot rows of page 0 are padding (see ``PagedAllocator``): the model may write there, but
    ``read_pages``/``write_pages`` refuse them. A page's bytes, as exported::

        | K layer 0 | K layer 1 | ... | V layer 0 | ... | V layer L-1 |
          each: [page_size, num_kv_heads, head_dim] of dtype, row-major

    Args:
        layout: the pool's shape.
        num_slots: rows per layer, a multiple of ``layout.page_size`` (use the allocator's
            ``num_slots``).
        device: where the model reads the pool.
    """

    def __init__(self, layout: KVLayout, num_slots: int, device: str | torch.device = "cpu"):
        if not isinstance(layout, KVLayout):
            raise ValueError(f"layout must be a KVLayout, got {type(layout).__name__}")
        ps = layout.page_size
        if not isinstance(num_slots, int) or isinstance(num_slots, bool) or num_slots <= 0:
            raise ValueError(f"num_slots must be a positive int, got {num_slots!r}")
        if num_slots % ps:
            raise ValueError(
                f"num_slots={num_slots} is not a multiple of page_size={ps}; "
                f"use PagedAllocator.num_slots (e.g. {-(-num_slots // ps) * ps})"
            )
        self.layout = layout
        self.page_size = ps
        self.num_slots = num_slots
        self.num_pages = num_slots // ps  # includes padding page 0
        nl, nh, hd = layout.num_layers, layout.num_kv_heads, layout.head_dim
        self.storage = torch.zeros(
            (2, nl, num_slots, nh, hd), dtype=layout.dtype, device=torch.device(device)
        )
        self.device = self.storage.device
        row_bytes = ps * nh * hd * layout.itemsize
        self._wide = _widest_dtype(row_bytes)
        self._rows_per_page = 2 * nl
        # Row (kv, layer, page) of this view is one page of one layer: ps * heads * dim values.
        self._rows = self.storage.view(torch.uint8).view(2 * nl * self.num_pages, row_bytes)
        self._rows = self._rows.view(self._wide)
        self._row_base = torch.arange(2 * nl, dtype=torch.int64, device=self.device)
        self._row_base *= self.num_pages
        self._offsets = torch.arange(ps, dtype=torch.int64, device=self.device)
        # NOTE: on CPU a numpy view of the same rows: numpy's per-call overhead is ~1 us
        # against torch's ~4 us, which is most of the cost of moving a few small pages.
        self._np_rows = self._pages_view.numpy() if self.device.type == "cpu" else None

    @property
    def replicated(self) -> bool:
        return self.layout.replicated

    @property
    def page_bytes(self) -> int:
        return self.layout.page_bytes

    @property
    def token_bytes(self) -> int:
        return self.layout.token_bytes

    @property
    def land_layers(self) -> int:
        return self.layout.num_layers

    def page_ids(self, slots: torch.Tensor) -> Any:
        """Page ids of whole-page slot runs the tree handed out (no checks: the tree's own): a
        numpy array for CPU slots (cheaper to index with), else a tensor on their device."""
        if slots.device.type == "cpu":
            return slots.numpy()[:: self.page_size] // self.page_size
        return slots[:: self.page_size].div(self.page_size, rounding_mode="floor")

    def k(self, layer: int) -> torch.Tensor:
        """K of ``layer`` as a view ``[num_slots, num_kv_heads, head_dim]``."""
        return self.storage[0, self._layer(layer)]

    def v(self, layer: int) -> torch.Tensor:
        """V of ``layer`` as a view ``[num_slots, num_kv_heads, head_dim]``."""
        return self.storage[1, self._layer(layer)]

    def read_pages(self, slots: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Copy whole pages out to host memory, page-major.

        Args:
            slots: int64 1-D, whole page-aligned pages of this pool (not page 0).
            out: optional host uint8 ``[num_pages, page_bytes]`` to fill (skips allocation).
                Its rows may be spaced (``out.stride() == (s, 1)``, ``s >= page_bytes``), e.g.
                the payloads of encoded pages in a staging buffer.

        Returns:
            uint8 CPU tensor ``[len(slots) // page_size, page_bytes]``; row i is page i.

        Raises:
            ValueError: for malformed slots or ``out``.
        """
        pages = self._pages(slots, unique=False)
        shape = (pages.numel(), self.layout.page_bytes)
        if out is None:
            out = (
                host_empty(shape)
                if self.device.type == "cuda"
                else torch.empty(shape, dtype=_UINT8)
            )
        elif (check_bytes("out", out, shape).device.type != "cpu" or out.stride(-1) != 1
              or (shape[0] > 1 and out.stride(0) < shape[1])):
            raise ValueError(
                f"out must be a CPU tensor with contiguous, non-overlapping rows, got "
                f"{out.device} {out.stride()}"
            )
        self.gather(pages, out)
        sync(self.device)  # the caller reads host memory next
        return out

    def gather(self, pages: torch.Tensor | np.ndarray, out: torch.Tensor) -> None:
        """``read_pages`` for page ids the caller guarantees (the linker's, from the tree):
        no checks. ``pages`` is an int64 tensor on the pool's device, or (CPU) a numpy array;
        ``out`` is host uint8 ``[len(pages), page_bytes]`` with contiguous rows, possibly
        spaced. On CUDA the copy is only queued on the current stream (the caller records an
        event or synchronizes before reading ``out``).
        """
        if out.shape[0] == 0:
            return
        if self._np_rows is None:
            self._gather_device(_torch_index(pages), out)
            return
        dst = self._rows_view(out)
        if dst is not None and out.shape[0] * out.shape[1] <= _SMALL_BYTES:
            # NOTE: small gathers in numpy: fancy indexing into a temporary, then one copy.
            dst.numpy()[...] = self._np_rows[:, _np_index(pages)].transpose(1, 0, 2)
            return
        if dst is None:  # NOTE: rows that cannot be widened (odd address): fill via a copy
            gathered = torch.index_select(self._rows, 0, self._row_index(_torch_index(pages)))
            out.copy_(gathered.view(_UINT8).view(out.shape))
        elif out.is_contiguous():
            # One gather, written straight into page-major order: no permute pass.
            idx = self._row_index(_torch_index(pages))
            torch.index_select(self._rows, 0, idx, out=dst.view(-1, dst.shape[2]))
        else:  # spaced rows (staging frames): one gather along the page dim of [rows, pages]
            torch.index_select(self._pages_view, 1, _torch_index(pages), out=dst.transpose(0, 1))

    def write_pages(self, slots: torch.Tensor, buf: torch.Tensor) -> None:
        """Copy page-major bytes (as returned by ``read_pages``) into ``slots``.

        Args:
            slots: int64 1-D, whole page-aligned pages of this pool (not page 0), no repeats.
            buf: uint8 ``[len(slots) // page_size, page_bytes]``, on the host or the device;
                rows may be spaced (staging frames) or unaligned.

        Raises:
            ValueError: for malformed slots or ``buf``; nothing is written then.
        """
        pages = self._pages(slots, unique=True)
        check_bytes("buf", buf, (pages.numel(), self.layout.page_bytes))
        self.scatter(pages, buf)
        sync(self.device)  # the pages are in place when this returns, whatever stream reads them

    def scatter(self, pages: torch.Tensor | np.ndarray, buf: torch.Tensor,
                layer: int | None = None) -> None:
        """``write_pages`` for page ids the caller guarantees (distinct, valid): no checks.
        With ``layer``, only that layer's K and V rows of each page are written (layer-wise
        loading). On CUDA the copy is only queued on the current stream.

        Args:
            pages: int64 page ids on this pool's device (on CPU also a numpy array).
            buf: uint8 ``[len(pages), page_bytes]`` pages (host or device; rows may be spaced).
            layer: one layer to write, or None for the whole pages.
        """
        if buf.shape[0] == 0:
            return
        src = self._rows_view(buf) if buf.device == self.device else None
        if src is None:
            src = self._rows_view(self.stage(buf))
            assert src is not None, "staged pages are aligned"
        if self._np_rows is not None:  # NOTE: numpy scatters any size at least as fast
            rows, at = self._np_rows, _np_index(pages)
            if layer is None:
                rows[:, at] = src.numpy().transpose(1, 0, 2)
            else:
                nl = self.layout.num_layers
                rows4 = rows.reshape(2, nl, self.num_pages, -1)
                rows4[:, self._layer(layer), at] = (
                    src.numpy().reshape(src.shape[0], 2, nl, -1)[:, :, layer].transpose(1, 0, 2))
            return
        self._scatter_device(_torch_index(pages), src, layer)

    def _scatter_device(self, index: torch.Tensor, src: torch.Tensor, layer: int | None) -> None:
        """CUDA: ``scatter`` of wide rows ``src`` (``_rows_view``) with torch index copies."""
        if layer is None:
            if src.is_contiguous():
                self._rows.index_copy_(0, self._row_index(index), src.view(-1, src.shape[2]))
            else:
                self._pages_view.index_copy_(1, index, src.transpose(0, 1))
            return
        nl = self.layout.num_layers
        dst = self._pages_view.view(2, nl, self.num_pages, -1)[:, self._layer(layer)]
        layer_rows = src.view(src.shape[0], 2, nl, -1)[:, :, layer]
        dst.index_copy_(1, index, layer_rows.transpose(0, 1))

    def stage(self, buf: torch.Tensor) -> torch.Tensor:
        """Pages (uint8 ``[n, page_bytes]``) as ``scatter`` reads them fastest: on this pool's
        device and aligned. Aligned pages already there are returned as they are; host pages
        bound for CUDA move in one copy of the span they cover (spaced rows keep their
        spacing, so staging frames need no repacking; the copy is queued on the current
        stream); anything that still cannot be widened is cloned. Stage once, then scatter
        layer by layer."""
        if buf.device != self.device:
            n, width = buf.shape
            stride = buf.stride(0) if n > 1 else width
            if buf.stride(-1) == 1 and stride >= width:
                span = (n - 1) * stride + width
                flat = to_device(buf.as_strided((span,), (1,)), self.device)
                buf = flat.as_strided((n, width), (stride, 1))
            else:
                buf = to_device(buf.contiguous(), self.device)
        if self._rows_view(buf) is None:
            buf = buf.clone(memory_format=torch.contiguous_format)
        return buf

    def _rows_view(self, buf: torch.Tensor) -> torch.Tensor | None:
        """``buf`` (uint8 pages, contiguous rows) as wide rows ``[pages, 2 * layers, row]``
        without a copy, or None when its address or row spacing cannot be widened."""
        wide = self._wide.itemsize
        if buf.stride(-1) != 1 or buf.data_ptr() % wide or (buf.shape[0] > 1 and
                                                              buf.stride(0) % wide):
            return None
        return buf.view(self._wide).view(buf.shape[0], self._rows_per_page, -1)

    def _gather_device(self, pages: torch.Tensor, out: torch.Tensor) -> None:
        """CUDA: gather into a device buffer laid out like ``out`` (spaced rows included),
        then one contiguous device-to-host copy of the span ``out`` covers."""
        n, stride = out.shape[0], out.stride(0)
        span = (n - 1) * stride + out.shape[1]
        temp = torch.empty(span + (-span) % 16, dtype=_UINT8, device=self.device)
        rows = temp.as_strided(out.shape, out.stride())
        wide = self._rows_view(rows)
        assert wide is not None, "a fresh device buffer is aligned"
        torch.index_select(self._pages_view, 1, pages, out=wide.transpose(0, 1))
        host = out.as_strided((span,), (1,))
        host.copy_(temp[:span], non_blocking=out.is_pinned())

    @property
    def _pages_view(self) -> torch.Tensor:
        """The pool as ``[2 * layers, pages, row]`` wide rows: dim 1 indexes pages."""
        return self._rows.view(self._rows_per_page, self.num_pages, -1)

    def _row_index(self, pages: torch.Tensor) -> torch.Tensor:
        return (pages[:, None] + self._row_base).reshape(-1)

    def _pages(self, slots: torch.Tensor, *, unique: bool) -> torch.Tensor:
        """Validated page ids (on the pool's device) of whole-page slot runs."""
        if not isinstance(slots, torch.Tensor):
            raise ValueError(f"slots must be an int64 torch.Tensor, got {type(slots).__name__}")
        if slots.dtype != torch.int64 or slots.dim() != 1:
            raise ValueError(
                f"slots must be int64 and 1-D, got {slots.dtype} shape {tuple(slots.shape)}"
            )
        ps = self.page_size
        if slots.numel() % ps:
            raise ValueError(
                f"{slots.numel()} slots is not a whole number of pages (page_size={ps})"
            )
        grid = slots.to(self.device).reshape(-1, ps)
        pages = grid[:, 0].div(ps, rounding_mode="floor")
        if pages.numel() == 0:
            return pages
        lo, hi = (int(x) for x in torch.aminmax(pages))
        if lo < 1 or hi >= self.num_pages:
            raise ValueError(
                f"slots {int(slots.min())}..{int(slots.max())} fall outside pages "
                f"1..{self.num_pages - 1} (slots {ps}..{self.num_slots - 1}; page 0 is padding)"
            )
        if ps > 1 and not torch.equal(grid, pages[:, None] * ps + self._offsets):
            raise ValueError(f"slots are not page-aligned runs of page_size={ps}")
        if unique and torch.unique(pages).numel() != pages.numel():
            raise ValueError("slots repeat a page; each page may be written once per call")
        return pages

    def _layer(self, layer: int) -> int:
        if not isinstance(layer, int) or not 0 <= layer < self.layout.num_layers:
            raise ValueError(f"layer must be in 0..{self.layout.num_layers - 1}, got {layer!r}")
        return layer
