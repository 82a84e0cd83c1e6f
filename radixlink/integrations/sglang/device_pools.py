"""SGLang's device pools as the linker moves them: per layer, the tensors whose rows are slots.

Owns the page byte layout of device pages and the batched gather/scatter between slots and
pages. Must not touch stores, the codec or SGLang's tree. SGLang is imported only inside
``build_device_pools``.

A stored page holds every layer of one page, layer after layer (layer ids ascending), and
within a layer each of its tensors (K then V; Mamba: temporal state then conv states) as the
page's rows::

    page = | layer 0: K rows | V rows | layer 1: K rows | V rows | ... |
             rows = page_size token slots (KV, SWA) or 1 state slot (MAMBA)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from radixlink.contract import PoolName
from radixlink.integrations.sglang.settings import SUPPORTED_MODELS
from radixlink.integrations.sglang.slot_runs import SlotRuns, byte_rows, page_index, typed


@dataclass(frozen=True, slots=True, kw_only=True)
class _Part:
    layer: int
    tensor: torch.Tensor  # [rows, ...], one row per slot
    offset: int  # byte offset of this tensor's rows within a page
    nbytes: int  # bytes of one page's rows
    row_bytes: int  # bytes of one slot's row
    rows: np.ndarray | None  # the tensor as uint8 [rows, row_bytes] numpy (CPU), for copy_runs


class PoolView:
    """One device pool: the tensors of each transfer layer, addressed by slot.

    Args:
        name: the pool.
        layers: transfer layer id -> tensors whose dim 0 is the slot (row) index.
        rows_per_page: slots per page (``page_size`` for KV / SWA, 1 for a Mamba state).
        replicated: the pool is identical on every tensor-parallel rank (MLA).
    """

    def __init__(
        self,
        name: PoolName,
        layers: Mapping[int, Sequence[torch.Tensor]],
        *,
        rows_per_page: int,
        replicated: bool = False,
    ) -> None:
        if not layers or any(not tensors for tensors in layers.values()):
            raise ValueError(f"pool {name.value}: every layer needs at least one tensor")
        self.name = name
        self.rows_per_page = rows_per_page
        self.replicated = replicated
        parts: list[_Part] = []
        offset = 0
        for layer in sorted(layers):
            for tensor in layers[layer]:
                row_bytes = tensor[0].numel() * tensor.element_size()
                nbytes = row_bytes * rows_per_page
                parts.append(_Part(layer=layer, tensor=tensor, offset=offset, nbytes=nbytes,
                                   row_bytes=row_bytes, rows=byte_rows(tensor)))
                offset += nbytes
        self._parts = tuple(parts)
        self._by_layer: dict[int, tuple[_Part, ...]] = {
            layer: tuple(p for p in parts if p.layer == layer) for layer in layers
        }
        self.page_bytes = offset
        self.device = parts[0].tensor.device
        self._numpy = all(p.rows is not None for p in parts)  # CPU tensors: copy_runs lands
        # NOTE: each tensor's bytes as one flat view, made once: a page's rows are a slice
        self._flat = tuple((memoryview(p.rows).cast("B"), p.row_bytes) for p in parts
                           if p.rows is not None) if self._numpy else ()

    @property
    def layer_ids(self) -> list[int]:
        """Transfer layers this pool has data in, ascending."""
        return sorted(self._by_layer)

    @property
    def fingerprint(self) -> str:
        """Everything that decides the page bytes: dtypes, row shapes, layers, page rows."""
        shapes = ";".join(
            f"{p.layer}:{str(p.tensor.dtype).removeprefix('torch.')}"
            f"{tuple(p.tensor.shape[1:])}"
            for p in self._parts
        )
        return f"sglang/{self.name.value}/rows={self.rows_per_page}/{shapes}"

    def plan(self, slots: torch.Tensor) -> SlotRuns:
        """``slots`` planned for ``write_layer``, once for every layer of a load.

        Raises:
            ValueError: ``slots`` is not a whole number of pages.
        """
        return SlotRuns.plan(self._index(slots), self.rows_per_page,
                             min(p.row_bytes for p in self._parts), self.device,
                             numpy=self._numpy)

    def _index(self, slots: torch.Tensor) -> torch.Tensor:
        try:
            return page_index(slots, self.rows_per_page, self.device)
        except ValueError as exc:
            raise ValueError(f"pool {self.name.value}: {exc}") from None

    def payload_views(self, slots: torch.Tensor) -> list[tuple[memoryview, ...]] | None:
        """Per page at ``slots`` the writable byte views its stored payload fills, in the
        page's order (its rows in each tensor, layer after layer): a load reads its pages
        straight into them (``Stream.targets``). None where pages cannot be written so: the
        pool is on a device or its rows are not dense, or a page's rows are not consecutive
        slots.

        Raises:
            ValueError: ``slots`` is not a whole number of pages, or names a slot the pool
                does not have.
        """
        if not self._numpy:
            return None
        index = self._index(slots).numpy()
        per_page = self.rows_per_page
        if per_page > 1 and not bool(
            (index[:, 1:] == index[:, :1] + np.arange(1, per_page)).all()
        ):
            return None
        firsts = index[:, 0]
        num_slots = int(self._parts[0].tensor.shape[0])
        if int(firsts.min()) < 0 or int(firsts.max()) + per_page > num_slots:
            raise ValueError(f"pool {self.name.value}: slots {int(firsts.min())}.."
                             f"{int(firsts.max()) + per_page - 1} are outside its "
                             f"{num_slots} slots")
        cuts: dict[int, list[slice]] = {}  # NOTE: per row size, the pages' slices (one set
        columns = []  # for most pools), each applied to every tensor in C
        for flat, row_bytes in self._flat:
            if row_bytes not in cuts:
                starts = (firsts * row_bytes).tolist()
                width = row_bytes * per_page
                cuts[row_bytes] = list(map(slice, starts, [a + width for a in starts]))
            columns.append(list(map(flat.__getitem__, cuts[row_bytes])))
        return list(zip(*columns))

    def read_pages(self, slots: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The pages at ``slots`` as a CPU ``uint8 [num_pages, page_bytes]`` tensor: ``out``
        (rows may be spaced: an offload's staging frames), or a new one.

        Raises:
            ValueError: ``slots`` is not a whole number of pages, or ``out`` has another shape.
        """
        slot_runs = self.plan(slots)
        if out is None:
            out = torch.empty(slot_runs.num_pages, self.page_bytes, dtype=torch.uint8)
        elif tuple(out.shape) != (slot_runs.num_pages, self.page_bytes):
            raise ValueError(f"pool {self.name.value}: out of shape {tuple(out.shape)} does not "
                             f"match {slot_runs.num_pages} pages of {self.page_bytes} bytes")
        if slot_runs.runs is not None and self._numpy:  # NOTE: one copy per run and tensor
            slot_runs.copy_runs([(p.rows, p.offset) for p in self._parts if p.rows is not None],
                                out.numpy(), into_slots=False)
            return out
        index = slot_runs.index.reshape(-1)
        for p in self._parts:  # NOTE: one gather per tensor, every page at once
            rows = p.tensor.index_select(0, index).view(torch.uint8)
            out[:, p.offset : p.offset + p.nbytes].copy_(rows.reshape(slot_runs.num_pages, -1))
        return out

    def write_layer(self, layer: int, slots: SlotRuns, pages: torch.Tensor) -> None:
        """Scatter layer ``layer`` of ``pages`` (``uint8 [num_pages, page_bytes]``) into
        ``slots`` (``plan``). A layer this pool has no data in is a no-op.

        Raises:
            ValueError: ``slots`` and ``pages`` disagree on the page count or size.
        """
        parts = self._by_layer.get(layer)
        if parts:
            self._write(parts, slots, pages)

    def write(self, slots: SlotRuns, pages: torch.Tensor) -> None:
        """Scatter every layer of ``pages`` (``uint8 [num_pages, page_bytes]``) into ``slots``
        (``plan``).

        Raises:
            ValueError: ``slots`` and ``pages`` disagree on the page count or size.
        """
        self._write(self._parts, slots, pages)

    def _write(self, parts: Sequence[_Part], slots: SlotRuns, pages: torch.Tensor) -> None:
        if tuple(pages.shape) != (slots.num_pages, self.page_bytes):
            raise ValueError(
                f"pool {self.name.value}: pages of shape {tuple(pages.shape)} do not match "
                f"{slots.num_pages} pages of {self.page_bytes} bytes"
            )
        # NOTE: each page's rows go straight from its (spaced) staging frame to their slots,
        # as a [page, row] view of the frames: one copy, never a contiguous one first
        if slots.runs is not None and self._numpy:
            slots.copy_runs([(p.rows, p.offset) for p in parts if p.rows is not None],
                            pages.numpy())
            return
        for p in parts:
            data = typed(pages[:, p.offset : p.offset + p.nbytes], p.tensor.dtype,
                         (slots.num_pages, self.rows_per_page, *p.tensor.shape[1:]))
            slots.scatter(p.tensor, 0, data)


@dataclass(frozen=True, slots=True, kw_only=True)
class DevicePools:
    """Every pool the linker moves, and the number of transfer layers the forward waits on."""

    pools: dict[PoolName, PoolView]
    num_layers: int

    @property
    def fingerprint(self) -> str:
        """The combined layout of all pools (part of the store namespace)."""
        return "|".join(self.pools[name].fingerprint for name in sorted(self.pools))


def build_device_pools(kvcache: Any, req_to_token_pool: Any, with_mamba: bool) -> DevicePools:
    """Views over SGLang's device pools: plain MHA or MLA, FULL + SWA (``SWAKVPool``) and
    FULL + MAMBA (``HybridLinearKVPool`` with the request pool's Mamba states).

    Raises:
        ValueError: a pool kind the linker does not move (quantized scales, DeepSeek V4,
            DSA indexers, ...), named in the message.
    """
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    start = int(getattr(kvcache, "start_layer", 0) or 0)
    pools: dict[PoolName, PoolView] = {}
    if isinstance(kvcache, SWAKVPool):
        full = {g - start: lid for g, (lid, swa) in kvcache.layers_mapping.items() if not swa}
        window = {g - start: lid for g, (lid, swa) in kvcache.layers_mapping.items() if swa}
        pools[PoolName.KV] = _attention_view(PoolName.KV, kvcache.full_kv_pool, full)
        pools[PoolName.SWA] = _attention_view(PoolName.SWA, kvcache.swa_kv_pool, window)
    elif isinstance(kvcache, HybridLinearKVPool):
        mapping = {g - start: lid for g, lid in kvcache.full_attention_layer_id_mapping.items()}
        pools[PoolName.KV] = _attention_view(PoolName.KV, kvcache.full_kv_pool, mapping)
    else:
        num = int(kvcache.layer_num)
        pools[PoolName.KV] = _attention_view(PoolName.KV, kvcache, {i: i for i in range(num)})
    if with_mamba:
        pools[PoolName.MAMBA] = _mamba_view(req_to_token_pool, start)
    num_layers = 1 + max(layer for view in pools.values() for layer in view.layer_ids)
    return DevicePools(pools=pools, num_layers=num_layers)


def _attention_view(name: PoolName, pool: Any, mapping: Mapping[int, int]) -> PoolView:
    if getattr(pool, "k_scale_buffer", None) is not None or getattr(
        pool, "native_k_scale_buffer", None
    ) is not None:
        raise ValueError(
            f"radixlink linker: {type(pool).__name__} keeps KV scales; quantized KV caches "
            "are not supported (use an unquantized --kv-cache-dtype)"
        )
    page_size = int(pool.page_size)
    layers: dict[int, tuple[torch.Tensor, ...]]
    if hasattr(pool, "k_buffer") and hasattr(pool, "v_buffer"):
        layers = {t: (pool.k_buffer[i], pool.v_buffer[i]) for t, i in mapping.items()}
        return PoolView(name, layers, rows_per_page=page_size)
    if hasattr(pool, "kv_buffer") and "MLA" in type(pool).__name__:
        layers = {t: (pool.kv_buffer[i],) for t, i in mapping.items()}
        return PoolView(name, layers, rows_per_page=page_size, replicated=True)
    raise ValueError(
        f"radixlink linker: device pool {type(pool).__name__} is not supported (supported: "
        f"MHA and MLA token pools, SWAKVPool, HybridLinearKVPool); {SUPPORTED_MODELS}"
    )


def _mamba_view(req_to_token_pool: Any, start: int) -> PoolView:
    mamba_pool = getattr(req_to_token_pool, "mamba_pool", None)
    if mamba_pool is None:
        raise ValueError("radixlink linker: MAMBA needs a HybridReqToTokenPool with Mamba states")
    cache = mamba_pool.mamba_cache
    states = [s for s in (cache.temporal, *cache.conv) if s.numel() > 0]
    layers = {
        g - start: tuple(state[i] for state in states)
        for g, i in req_to_token_pool.mamba_map.items()
    }
    return PoolView(PoolName.MAMBA, layers, rows_per_page=1)
