"""SGLang HiCache L3 backends on real CPU host pools, made through SGLang's backend factory.

A host "node" is SGLang's ``MHATokenToKVPoolHost`` (any of the four layouts) over a small CPU
device pool, plus a storage backend created and registered the way SGLang's cache controller
does it (cache_controller.py l. 614-617).
"""

from __future__ import annotations

from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.storage import StorageBackendFactory
from sglang.srt.mem_cache.utils import get_hash_str
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
PAGE = 4
LAYERS = 3
HEADS = 2
DIM = 8
BACKEND = {
    "backend_name": "radixlink",
    "module_path": "radixlink.integrations.sglang.hicache",
    "class_name": "RadixlinkHiCacheStorage",
    "interface_v1": 1,
}


def host_pool(layout: str, device_tokens: int = 64) -> MHATokenToKVPoolHost:
    """SGLang's MHA host pool in ``layout`` over a CPU device pool (2x its tokens)."""
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=PAGE))
    device = MHATokenToKVPool(
        size=device_tokens, page_size=PAGE, dtype=torch.bfloat16, head_num=HEADS, head_dim=DIM,
        layer_num=LAYERS, device="cpu", enable_memory_saver=False,
    )
    return MHATokenToKVPoolHost(
        device._mha_buffer_info(), host_to_device_ratio=2.0, host_size=0, page_size=PAGE,
        layout=layout, pin_memory=False, device="cpu", device_capacity_tokens=device_tokens,
        start_layer=0, end_layer=LAYERS,
    )


def storage_config(extra: dict[str, Any], *, layout: str, tp_rank: int = 0,
                   tp_size: int = 1, mla: bool = False) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
        is_page_first_layout=layout == "page_first", model_name="dummy",
        extra_config=dict(extra),
    )


def make_backend(backend: str, extra: dict[str, Any], pool: Any, **config: Any) -> Any:
    """``backend`` ("dynamic" or "file") through SGLang's factory, registered with ``pool``."""
    cfg = storage_config(extra, layout=pool.layout, **config)
    storage = StorageBackendFactory.create_backend(backend, cfg, pool)
    storage.register_mem_pool_host(pool)
    return storage


def fill(pool: MHATokenToKVPoolHost, indices: torch.Tensor, seed: int) -> None:
    """Random KV at host ``indices``, through SGLang's own page setter."""
    gen = torch.Generator().manual_seed(seed)
    for start in indices[::PAGE].tolist():
        page = pool.get_dummy_flat_data_page()
        page.copy_(torch.randn(page.shape, generator=gen).to(page.dtype))
        pool.set_from_flat_data_page(start, page)


def tokens_of(pool: MHATokenToKVPoolHost, indices: torch.Tensor) -> torch.Tensor:
    """``[pages, 2, layers, page, heads, dim]``: the KV of each page whatever the layout, read
    with SGLang's ``get_data_page`` (an oracle independent of radixlink's page format)."""
    out = []
    for start in indices[::PAGE].tolist():
        page = pool.get_data_page(start, flat=False)
        if pool.layout == "page_first":  # [2, P, L, H, D]
            page = page.permute(0, 2, 1, 3, 4)
        elif pool.layout == "page_first_direct":  # [2, 1, L, P, H, D]
            page = page[:, 0]
        elif pool.layout == "page_head":  # [2, 1, H, P, L, D]
            page = page[:, 0].permute(0, 3, 2, 1, 4)
        out.append(page.clone())
    return torch.stack(out)


def page_hashes(tokens: list[int]) -> list[str]:
    """SGLang's own page keys for ``tokens`` (get_hash_str)."""
    return list(get_hash_str(tokens, None, page_size=PAGE))


def saved(url: str, tokens: list[int], seed: int) -> tuple[Any, MHATokenToKVPoolHost,
                                                            list[str], torch.Tensor]:
    """A page-first HiCache backend on store ``url`` that saved ``tokens``' pages (data from
    ``seed``): ``(backend, host pool, page keys, host slots)``."""
    keys = page_hashes(tokens)
    pool = host_pool("page_first")
    node = make_backend("dynamic", {**BACKEND, "store": url}, pool)
    src = pool.alloc(len(tokens))
    fill(pool, src, seed=seed)
    assert all(node.batch_set_v1(keys, src))
    return node, pool, keys, src
