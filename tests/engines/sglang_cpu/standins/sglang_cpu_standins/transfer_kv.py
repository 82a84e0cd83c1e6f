"""Stand-in for ``sgl_kernel.kvcacheio.transfer_kv_direct`` in SGLang's
``srt/mem_cache/pool_host/mha.py``.

Why: HiCache's ``direct`` I/O backend with the ``layer_first`` host layout moves K/V rows
between the device pool and the host pool with ``transfer_kv_direct``, which ``mha.py`` imports
only on CUDA, ROCm and XPU; on CPU the name is undefined. This is the same row copy in pure
torch: for each (source, destination) layer pair, the rows at ``src_indices`` go to the rows at
``dst_indices``. ``page_first`` layouts use other kernels (``transfer_kv_*_pf_lf``), which are
not stood in for: the suite runs ``--hicache-mem-layout layer_first``. No model math.
"""

from __future__ import annotations

from types import ModuleType

import torch

MODULE = "sglang.srt.mem_cache.pool_host.mha"


def transfer_kv_direct(src_layers: list[torch.Tensor], dst_layers: list[torch.Tensor],
                       src_indices: torch.Tensor, dst_indices: torch.Tensor,
                       page_size: int) -> None:
    """``dst[dst_indices] = src[src_indices]`` for each layer pair (rows: token slots)."""
    del page_size  # NOTE: the kernel copies page runs; row indexing gives the same bytes
    src_idx = src_indices.to(torch.int64)
    dst_idx = dst_indices.to(torch.int64)
    for src, dst in zip(src_layers, dst_layers, strict=True):
        rows = src.reshape(src.shape[0], -1).index_select(0, src_idx.to(src.device))
        dst.reshape(dst.shape[0], -1).index_copy_(0, dst_idx.to(dst.device),
                                                  rows.to(dst.dtype))


def patch(module: ModuleType) -> None:
    module.transfer_kv_direct = transfer_kv_direct  # type: ignore[attr-defined]
