"""Device pools: paged K/V tensors (full attention and SWA) and Mamba-style state slots.

Owns the tensors and their byte-exact page/state export and import. Knows nothing of the tree,
of allocation policy (see allocator.py) or of stores.
"""

from __future__ import annotations

import operator

import torch

from radixlink.memory.layout import KVLayout, StateLayout

_UINT8 = torch.uint8
# NOTE: scatter/gather move rows as the widest element type that divides a row; on CPU
# index_copy_ runs one element at a time, so 16-byte elements cut its per-element overhead ~8x.
_WIDE_DTYPES = (torch.complex128, torch.int64, torch.int32, torch.int16, torch.uint8)


def _widest_dtype(row_bytes: int) -> torch.dtype:
    return next(dt for dt in _WIDE_DTYPES if row_bytes % dt.itemsize == 0)


def _host_empty(shape: tuple[int, ...]) -> torch.Tensor:
    """A host uint8 buffer, pinned when CUDA is present (the staging tier)."""
    return torch.empty(shape, dtype=_UINT8, pin_memory=torch.cuda.is_available())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def _check_bytes(name: str, buf: object, shape: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(buf, torch.Tensor):
        raise ValueError(f"{name} must be a uint8 torch.Tensor, got {type(buf).__name__}")
    if buf.dtype != _UINT8:
        raise ValueError(f"{name} must be uint8, got {buf.dtype}; use .view(torch.uint8)")
    if tuple(buf.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(buf.shape)}, expected {shape}")
    return buf


def _to_device(buf: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``buf`` on ``device``; host data bound for CUDA goes through pinned staging."""
    if buf.device == device:
        return buf
    if device.type == "cuda" and buf.device.type == "cpu" and not buf.is_pinned():
        staged = _host_empty(tuple(buf.shape))
        staged.copy_(buf)
        buf = staged
    # NOTE: the caching host allocator keeps `staged` alive until this copy has run.
    return buf.to(device, non_blocking=True)


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

        Returns:
            uint8 CPU tensor ``[len(slots) // page_size, page_bytes]``; row i is page i.

        Raises:
            ValueError: for malformed slots or ``out``.
        """
        idx = self._row_index(self._pages(slots, unique=False))
        shape = (idx.numel() // self._rows_per_page, self.layout.page_bytes)
        if out is None:
            out = (
                _host_empty(shape)
                if self.device.type == "cuda"
                else torch.empty(shape, dtype=_UINT8)
            )
        elif _check_bytes("out", out, shape).device.type != "cpu" or not out.is_contiguous():
            raise ValueError(
                f"out must be a contiguous CPU tensor, got {out.device} {out.stride()}"
            )
        if out.data_ptr() % self._wide.itemsize:  # cannot be viewed as wide rows: fill a copy
            out.copy_(self.read_pages(slots))
            return out
        if self.device.type == "cpu":
            # One gather, written straight into page-major order: no permute pass.
            torch.index_select(self._rows, 0, idx, out=self._as_rows(out))
            return out
        gathered = torch.index_select(self._rows, 0, idx)
        self._as_rows(out).copy_(gathered, non_blocking=True)
        _sync(self.device)  # the caller reads host memory next
        return out

    def write_pages(self, slots: torch.Tensor, buf: torch.Tensor) -> None:
        """Copy page-major bytes (as returned by ``read_pages``) into ``slots``.

        Args:
            slots: int64 1-D, whole page-aligned pages of this pool (not page 0), no repeats.
            buf: uint8 ``[len(slots) // page_size, page_bytes]``, on the host or the device.

        Raises:
            ValueError: for malformed slots or ``buf``; nothing is written then.
        """
        idx = self._row_index(self._pages(slots, unique=True))
        shape = (idx.numel() // self._rows_per_page, self.layout.page_bytes)
        src = _to_device(_check_bytes("buf", buf, shape).contiguous(), self.device)
        if src.data_ptr() % self._wide.itemsize:
            # Unaligned bytes (e.g. sliced from a socket buffer) cannot be widened in place.
            src = src.clone()
        self._rows.index_copy_(0, idx, self._as_rows(src))
        _sync(self.device)  # the pages are in place when this returns, whatever stream reads them

    def _as_rows(self, buf: torch.Tensor) -> torch.Tensor:
        """``buf`` (aligned, contiguous uint8 pages) as the wide rows of ``self._rows``."""
        return buf.view(self._wide).view(buf.shape[0] * self._rows_per_page, self._rows.shape[1])

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


class MambaStatePool:
    """Recurrent-state slots: per state tensor a storage ``[num_states + 1, *shape]``.

    Slot 0 is reserved (padding), slots 1..num_states are handed out one at a time. A state's
    bytes, as exported, are each tensor's row in ``layout.shapes`` order.

    Args:
        num_states: usable slots.
        layout: shapes and dtype of one slot.
        device: where the model reads the states.
    """

    def __init__(self, num_states: int, layout: StateLayout, device: str | torch.device = "cpu"):
        if not isinstance(num_states, int) or isinstance(num_states, bool) or num_states <= 0:
            raise ValueError(f"num_states must be a positive int, got {num_states!r}")
        if not isinstance(layout, StateLayout):
            raise ValueError(f"layout must be a StateLayout, got {type(layout).__name__}")
        self.layout = layout
        self.num_states = num_states
        dev = torch.device(device)
        self._storages = [
            torch.zeros((num_states + 1, *shape), dtype=layout.dtype, device=dev)
            for shape in layout.shapes
        ]
        self.device = self._storages[0].device
        self._free_slots = list(range(num_states, 0, -1))  # pop() hands out 1 first
        self._is_free = [False] + [True] * num_states

    @property
    def num_tensors(self) -> int:
        return len(self._storages)

    def tensors(self, i: int) -> torch.Tensor:
        """Storage of state tensor ``i``: ``[num_states + 1, *layout.shapes[i]]``, row = slot."""
        if not isinstance(i, int) or not 0 <= i < len(self._storages):
            raise ValueError(f"state tensor index must be in 0..{self.num_tensors - 1}, got {i!r}")
        return self._storages[i]

    def total_size(self) -> int:
        return self.num_states

    def available_size(self) -> int:
        return len(self._free_slots)

    def is_allocated(self, slot: int) -> bool:
        return isinstance(slot, int) and 1 <= slot <= self.num_states and not self._is_free[slot]

    def alloc(self) -> int | None:
        """A free slot (its contents are stale), or None when all are in use."""
        if not self._free_slots:
            return None
        slot = self._free_slots.pop()
        self._is_free[slot] = False
        return slot

    def free(self, slot: int) -> None:
        """Return ``slot``. Raises ValueError for a double free or a slot never handed out."""
        slot = self._allocated(slot, "free")
        self._is_free[slot] = True
        self._free_slots.append(slot)

    def copy(self, src: int, dst: int) -> None:
        """Copy state ``src`` into ``dst`` (copy-on-write); both must be allocated."""
        src, dst = self._allocated(src, "copy from"), self._allocated(dst, "copy to")
        for storage in self._storages:
            storage[dst].copy_(storage[src])

    def read_state(self, slot: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """The bytes of ``slot`` as a uint8 CPU tensor ``[state_bytes]`` (optionally ``out``)."""
        slot = self._allocated(slot, "read")
        shape = (self.layout.state_bytes,)
        if out is None:
            out = (
                _host_empty(shape)
                if self.device.type == "cuda"
                else torch.empty(shape, dtype=_UINT8)
            )
        elif _check_bytes("out", out, shape).device.type != "cpu":
            raise ValueError(f"out must be a CPU tensor, got {out.device}")
        offset = 0
        for storage, nbytes in zip(self._storages, self.layout.tensor_bytes, strict=True):
            row = storage[slot].reshape(-1).view(_UINT8)
            out[offset : offset + nbytes].copy_(row, non_blocking=True)
            offset += nbytes
        _sync(self.device)  # the caller reads host memory next
        return out

    def write_state(self, slot: int, buf: torch.Tensor) -> None:
        """Write ``buf`` (uint8 ``[state_bytes]``, as from ``read_state``) into ``slot``."""
        slot = self._allocated(slot, "write")
        src = _to_device(_check_bytes("buf", buf, (self.layout.state_bytes,)), self.device)
        offset = 0
        for storage, nbytes in zip(self._storages, self.layout.tensor_bytes, strict=True):
            storage[slot].reshape(-1).view(_UINT8).copy_(src[offset : offset + nbytes])
            offset += nbytes
        _sync(self.device)  # the state is in place when this returns

    def _allocated(self, slot: object, action: str) -> int:
        try:
            value = operator.index(slot)  # type: ignore[arg-type]
        except TypeError:
            value = None
        if value is None or isinstance(slot, bool) or not 1 <= value <= self.num_states:
            raise ValueError(f"cannot {action} state slot {slot!r}: valid 1..{self.num_states}")
        if self._is_free[value]:
            raise ValueError(
                f"cannot {action} state slot {value}: it is not allocated (double free?)"
            )
        return value
