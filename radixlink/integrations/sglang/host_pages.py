"""SGLang host (CPU) pools as pages: batched copies between host slots and stored page bytes.

Owns the page byte layout of host pages. MHA host pools in the four HiCache layouts share one
canonical page format, so nodes with different ``--hicache-mem-layout`` share pages::

    page = [layer][K, V][token of the page][head][head dim]   (layer 0 first)

Other host pools (MLA, Mamba, ...) are stored as SGLang's own flat page of that pool, with the
pool class and layout in the fingerprint. Must not touch stores, keys or the codec; does not
import SGLang.
"""

from __future__ import annotations

from typing import Any

import torch

from radixlink.integrations.sglang.slot_runs import SlotRuns, typed

# Per MHA layout: which dim of kv_buffer is indexed (by token slot or by page), and the
# names of the dims of a selected block once the token dim is split into (page, token).
_CANONICAL = ("page", "layer", "kv", "token", "head", "dim")
_MHA_LAYOUTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "layer_first": ("token", ("kv", "layer", "page", "token", "head", "dim")),
    "page_first": ("token", ("kv", "page", "token", "layer", "head", "dim")),
    "page_first_direct": ("page", ("kv", "page", "layer", "token", "head", "dim")),
    "page_head": ("page", ("kv", "page", "head", "token", "layer", "dim")),
}


class HostPages:
    """Reads and writes whole pages of one host pool.

    Args:
        pool: an SGLang ``HostKVCache`` (``page_size``, ``dtype``, ``layout``, and either an
            MHA ``kv_buffer`` or ``get_data_page`` / ``set_from_flat_data_page``).
    """

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.page_size = int(getattr(pool, "page_size", 1) or 1)
        layout = getattr(pool, "layout", "")
        kv = getattr(pool, "kv_buffer", None)
        mha = (
            layout in _MHA_LAYOUTS
            and isinstance(kv, torch.Tensor)
            and kv.dim() in (5, 6)
            and kv.shape[0] == 2
            and hasattr(pool, "head_num")
        )
        self._mha = mha
        if mha:
            assert isinstance(kv, torch.Tensor)
            self._indexed, names = _MHA_LAYOUTS[layout]
            self._names = names
            self._to_canonical = [names.index(n) for n in _CANONICAL]
            self._from_canonical = [_CANONICAL.index(n) for n in names]
            self._token_dim = names.index("token") - (1 if names.index("page") < names.index(
                "token") else 0)  # the token dim of kv_buffer before the split
            shape = (pool.layer_num, 2, self.page_size, pool.head_num, pool.head_dim)
            self.page_bytes = kv.element_size() * int(torch.Size(shape).numel())
            self.fingerprint = (
                f"sglang-host/mha/{str(kv.dtype).removeprefix('torch.')}/layers="
                f"{pool.layer_num}/heads={pool.head_num}/dim={pool.head_dim}/page={self.page_size}"
            )
        else:
            dummy = pool.get_dummy_flat_data_page()
            self.page_bytes = dummy.numel() * dummy.element_size()
            self.fingerprint = (
                f"sglang-host/{type(pool).__name__}/{layout}/"
                f"{str(dummy.dtype).removeprefix('torch.')}/bytes={self.page_bytes}"
            )

    def read(self, host_indices: torch.Tensor) -> torch.Tensor:
        """The pages starting at every ``page_size``-th of ``host_indices``, as a CPU
        ``uint8 [num_pages, page_bytes]`` tensor (a copy).

        Raises:
            ValueError: ``host_indices`` is not a whole number of pages.
        """
        starts = self._starts(host_indices)
        if not self._mha:
            pages = [self.pool.get_data_page(int(s), flat=True) for s in starts.tolist()]
            return torch.stack([p.contiguous().view(torch.uint8) for p in pages])
        block = self._select(host_indices.reshape(-1).to(torch.int64), starts)
        return block.permute(self._to_canonical).contiguous().view(torch.uint8).reshape(
            len(starts), -1
        )

    def write(self, host_indices: torch.Tensor, pages: torch.Tensor) -> None:
        """Place ``pages`` (``uint8 [num_pages, page_bytes]``) at ``host_indices``."""
        starts = self._starts(host_indices)
        if tuple(pages.shape) != (len(starts), self.page_bytes):
            raise ValueError(
                f"host pages of shape {tuple(pages.shape)} do not match {len(starts)} pages "
                f"of {self.page_bytes} bytes"
            )
        if not self._mha:
            dtype = self.pool.get_dummy_flat_data_page().dtype
            for start, page in zip(starts.tolist(), pages):
                self.pool.set_from_flat_data_page(int(start), page.contiguous().view(dtype))
            return
        kv, pool = self.pool.kv_buffer, self.pool
        canonical = typed(pages, kv.dtype, (len(starts), pool.layer_num, 2, self.page_size,
                                            pool.head_num, pool.head_dim))
        block = canonical.permute(self._from_canonical)
        # NOTE: straight from the (spaced) staging frames into the pool: one copy per run of
        # consecutive slots where runs are long, else one index_put_, never a contiguous copy
        row_bytes = pool.head_num * pool.head_dim * kv.element_size()
        page_dim = self._names.index("page")
        if self._indexed == "page":
            slots = SlotRuns.plan(starts // self.page_size, 1, row_bytes * self.page_size,
                                  kv.device)
            slots.scatter(kv, page_dim, block.unsqueeze(page_dim + 1))
        else:
            slots = SlotRuns.plan(host_indices, self.page_size, row_bytes, kv.device)
            slots.scatter(kv, page_dim, block)

    def _select(self, tokens: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        kv = self.pool.kv_buffer
        if self._indexed == "page":
            return kv.index_select(1, starts // self.page_size)
        block = kv.index_select(self._token_dim, tokens)
        return block.unflatten(self._token_dim, (len(starts), self.page_size))

    def _starts(self, host_indices: torch.Tensor) -> torch.Tensor:
        flat = host_indices.reshape(-1).to(torch.int64)
        if flat.numel() % self.page_size:
            raise ValueError(
                f"{flat.numel()} host slots is not a whole number of {self.page_size}-slot pages"
            )
        return flat[:: self.page_size].cpu()
