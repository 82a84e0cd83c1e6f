"""Pages of one vLLM KV cache group: batched gather from / scatter into its per-layer KV tensors.

Owns the byte layout of a page (every layer of the group for one block, each layer's block in
the tensor's physical memory order). Must not know stores, keys or requests.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_DIM_NAMES = "HNC"  # vLLM's logical per-layer view is [B, H, N, C] (block, head, token, content)


class PagedGroup:
    """The KV tensors of one group's layers, addressed by vLLM block id (dimension 0).

    A page is one block of every layer, layer after layer; within a layer, the block's
    elements come in the tensor's physical order (dimensions sorted by stride), so that on a
    block-contiguous layout (LBNHC, BLNHC ...) gathering a block is one contiguous read.
    ``order`` names that order and goes into the codec's layout fingerprint::

        page i = | layer 0: block b_i | layer 1: block b_i | ... |   (each layer_page_bytes)

    Args:
        layers: the group's per-layer KV tensors, in the group's layer order; all of one
            shape, dtype and device, block id first.

    Raises:
        ValueError: no layers, or layers of different shapes, dtypes or devices.
    """

    def __init__(self, layers: Sequence[torch.Tensor]):
        if not layers:
            raise ValueError("a KV cache group needs at least one layer tensor")
        first = layers[0]
        for t in layers[1:]:
            if t.shape != first.shape or t.dtype != first.dtype or t.device != first.device:
                raise ValueError(
                    f"layers of one KV cache group differ: {tuple(t.shape)} {t.dtype} "
                    f"{t.device} vs {tuple(first.shape)} {first.dtype} {first.device}"
                )
        strides = first.stride()
        inner = sorted(range(1, first.dim()), key=lambda d: -strides[d])
        self.order = "".join(_dim_name(first.dim(), d) for d in inner)
        self._views = [t.permute(0, *inner) for t in layers]
        self._inner_shape = tuple(self._views[0].shape[1:])
        # NOTE: gathers run on raw bytes: CPU index_select of uint8 rows is a row memcpy,
        # ~10x faster than of fp16 rows (radixlink.bench.vllm_connector measures it).
        self._flat = [_flat_blocks(v) for v in self._views]
        # NOTE: payload_views's: each layer's blocks as one flat byte view and the stride
        # between blocks, made on first use
        self._bytes: list[tuple[memoryview, int]] | None = None
        self.num_blocks = int(first.shape[0])
        self.dtype = first.dtype
        self.device = first.device
        self.num_layers = len(layers)
        self.layer_page_elems = int(torch.Size(self._inner_shape).numel())
        self.layer_page_bytes = self.layer_page_elems * first.element_size()
        self.page_bytes = self.layer_page_bytes * self.num_layers

    def payload_views(self, block_ids: Sequence[int]) -> list[tuple[memoryview, ...]] | None:
        """Per block the writable byte views a stored page fills, in the page's order (the
        block's run in each layer): a load reads its pages straight into them
        (``Stream.targets``). None where blocks cannot be written so: KV off the host, or a
        layout whose blocks are not one run per layer.

        Raises:
            ValueError: a block id outside ``[0, num_blocks)``.
        """
        if self.device.type != "cpu" or not self.block_contiguous:
            return None
        if any(not 0 <= b < self.num_blocks for b in block_ids):
            raise ValueError(f"block ids {list(block_ids)[:8]} are not all within "
                             f"[0, {self.num_blocks})")
        if self._bytes is None:
            self._bytes = [_byte_span(f) for f in self._flat if f is not None]
        size, out = self.layer_page_bytes, []
        for flat, stride in self._bytes:  # NOTE: the slices built and applied in C
            cuts = [slice(b * stride, b * stride + size) for b in block_ids]
            out.append(list(map(flat.__getitem__, cuts)))
        return list(zip(*out))

    @property
    def block_contiguous(self) -> bool:
        """Whether each layer's block is one contiguous run (gathers are plain reads)."""
        return all(f is not None for f in self._flat)

    def gather(self, block_ids: Sequence[int], out: torch.Tensor | None = None) -> torch.Tensor:
        """The pages of ``block_ids`` as a CPU uint8 tensor ``[len(block_ids), page_bytes]``:
        ``out`` (a host uint8 tensor of exactly ``len(block_ids) * page_bytes`` bytes, e.g.
        a reused staging buffer; pinned for CUDA tensors) or a new one.

        One ``index_select`` per layer into a ``[n, layers, page]`` buffer on the KV device,
        then one copy to the host (stream-ordered on CUDA: it reads the blocks before any
        later kernel can overwrite them).

        Raises:
            ValueError: ``out`` is not a host uint8 tensor of that size.
        """
        n = len(block_ids)
        if out is not None and (out.dtype != torch.uint8 or out.device.type != "cpu"
                                or out.numel() != n * self.page_bytes):
            raise ValueError(f"gather out= must be a host uint8 tensor of {n * self.page_bytes}"
                             f" bytes, got {out.dtype} {out.device} of {out.numel()}")
        idx = torch.as_tensor(block_ids, dtype=torch.int64).to(self.device)
        shape = (n, self.num_layers, self.layer_page_bytes)
        on_host = self.device.type == "cpu"
        # NOTE: on CPU the layers gather straight into the caller's buffer (no fresh buffer to
        # fault in: a new 32 MiB tensor made the gather run at clone speed, 0.16x of a copy)
        dst = (out.view(shape) if out is not None and on_host
               else torch.empty(shape, dtype=torch.uint8, device=self.device))
        for layer, (view, flat) in enumerate(zip(self._views, self._flat)):
            if flat is not None:
                torch.index_select(flat, 0, idx, out=dst[:, layer])
            else:  # NOTE: a layout whose blocks are strided (e.g. LHBNC) needs a temporary
                rows = view.index_select(0, idx).reshape(n, -1)
                dst[:, layer] = rows.view(torch.uint8)
        pages = dst.view(n, -1)
        if on_host:
            return pages
        if out is None:
            return pages.cpu()
        host = out.view(n, -1)
        host.copy_(pages)  # NOTE: blocking, as .cpu(): the blocks are read before this returns
        return host

    def scatter(self, block_ids: Sequence[int], pages: torch.Tensor,
                rows: Sequence[int] | None = None) -> None:  # fmt: skip
        """Write pages into the blocks: ``block_ids[i]`` takes row ``rows[i]`` of ``pages``
        (row ``i`` without ``rows``), so pages fetched once can land in several requests'
        blocks without a copy first.

        Args:
            block_ids: the destination blocks.
            pages: uint8 ``[num_rows, page_bytes]``, any device; rows may be strided (e.g.
                payload views of a staging buffer of encoded frames), each row contiguous.
            rows: per block id its row of ``pages``.

        Raises:
            ValueError: ``pages`` is not uint8 rows of ``page_bytes``, or a row is missing.
        """
        n = len(block_ids)
        rows = list(range(n)) if rows is None else list(rows)
        if (pages.dtype != torch.uint8 or pages.dim() != 2 or pages.shape[1] != self.page_bytes
                or pages.stride(1) != 1 or len(rows) != n
                or any(not 0 <= r < pages.shape[0] for r in rows)):
            raise ValueError(
                f"scatter needs uint8 pages [rows, {self.page_bytes}] (contiguous rows) and one "
                f"row per block: got {tuple(pages.shape)} {pages.dtype}, {n} blocks, rows "
                f"{rows[:8]}"
            )
        if not n:
            return
        src = _on_device(pages, self.device).view(-1, self.num_layers, self.layer_page_bytes)
        on_cpu = self.device.type == "cpu"
        if on_cpu and self.block_contiguous:
            # NOTE: CPU index_copy_ moves bytes one element at a time (~0.7 GB/s measured);
            # one row copy per block is a memcpy each (~4x faster on 64 KiB rows), reading the
            # staging row in place. All of them go in one call, which lets go of the GIL once:
            # on an I/O thread beside vLLM's busy engine loop, each copy_ of a loop waited for
            # the GIL again (a 189 MB load: 0.08 s -> 0.35 s, measured).
            dst = [flat[b] for flat in self._flat for b in block_ids]  # type: ignore[index]
            layers = [src[:, layer] for layer in range(self.num_layers)]
            torch._foreach_copy_(dst, [layer_src[r] for layer_src in layers for r in rows])
            return
        idx = torch.as_tensor(block_ids, dtype=torch.int64).to(self.device)
        picked = None if on_cpu else torch.as_tensor(rows, dtype=torch.int64).to(self.device)
        for layer, (view, flat) in enumerate(zip(self._views, self._flat)):
            layer_src = src[:, layer]
            chosen = layer_src[rows] if picked is None else layer_src.index_select(0, picked)
            if flat is None:
                values = chosen.contiguous().view(self.dtype)
                view.index_copy_(0, idx, values.view(n, *self._inner_shape))
            else:
                flat.index_copy_(0, idx, chosen)


def _on_device(pages: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``pages`` on ``device``. Strided host rows go over as their whole dense span (one copy,
    the bytes between rows included) rather than through a contiguous host copy first."""
    if pages.device == device or pages.is_contiguous():
        return pages.to(device)
    num_rows, stride = pages.shape[0], pages.stride(0)
    if pages.storage_offset() + num_rows * stride > pages.untyped_storage().nbytes():
        return pages.to(device)  # NOTE: no room for the last row's span: a host copy first
    span = pages.as_strided((num_rows, stride), (stride, 1))
    return span.to(device)[:, : pages.shape[1]]  # NOTE: blocking: the staging is reused next


def _dim_name(ndim: int, dim: int) -> str:
    """Letter of a logical dimension: H, N, C for 4-D views; K(ernel block) first for 5-D."""
    names = _DIM_NAMES if ndim == 4 else "K" + _DIM_NAMES
    return names[dim - 1] if dim - 1 < len(names) else f"d{dim}"


def _byte_span(flat: torch.Tensor) -> tuple[memoryview, int]:
    """A host ``[blocks, bytes]`` uint8 view (rows contiguous, maybe spaced) as one writable
    byte view from its first block's first byte to its last block's last, and the stride
    between blocks."""
    stride = flat.stride(0)
    span = (flat.shape[0] - 1) * stride + flat.shape[1]
    return memoryview(flat.as_strided((span,), (1,)).numpy()), stride


def _flat_blocks(view: torch.Tensor) -> torch.Tensor | None:
    """``view`` as uint8 ``[blocks, bytes]`` without a copy when each block is one contiguous
    run, else None."""
    expected = 1
    for size, stride in zip(reversed(view.shape[1:]), reversed(view.stride()[1:])):
        if size != 1 and stride != expected:
            return None
        expected *= size
    return view.as_strided((view.shape[0], expected), (view.stride(0), 1)).view(torch.uint8)
