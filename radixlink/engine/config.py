"""Pool sizing for the reference engine: the K/V layout of a model's layers and a
``CacheConfig`` sized and namespaced for a model.

Owns no state. Must not build caches or run models.
"""

from __future__ import annotations

from typing import Any

from radixlink.config import CacheConfig
from radixlink.contract import ComponentType, PoolName
from radixlink.engine.model import ModelSpec
from radixlink.hashing import Namespace
from radixlink.memory.layout import KVLayout, StateLayout


def kv_layout(spec: ModelSpec, page_size: int,
              kind: ComponentType = ComponentType.FULL) -> KVLayout:
    """The K/V pool layout of ``spec``'s layers of ``kind`` (FULL or SWA), in the model dtype."""
    num = len(spec.layer_ids(kind))
    if num == 0:
        raise ValueError(f"model {spec.name!r} has no {kind.value} attention layer; a K/V pool "
                         "needs at least one")
    return KVLayout(num_layers=num, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                    dtype=spec.dtype, page_size=page_size)


def cache_config(spec: ModelSpec, *, num_tokens: int, page_size: int = 16,
                 linker: bool = False) -> CacheConfig:
    """A ``CacheConfig`` sized for ``spec`` (SWA and Mamba pools for hybrid models),
    namespaced by the model and layout fingerprints.

    Args:
        spec: the model.
        num_tokens: device slots of the full (and SWA) pool, rounded up to whole pages.
        page_size: tokens per page.
        linker: build for an ``ExternalCacheLinker`` (page hashes on).
    """
    kinds = set(spec.layer_types)
    layouts = [kv_layout(spec, page_size)]
    hybrid: dict[str, Any] = {}
    if ComponentType.SWA in kinds:
        layouts.append(kv_layout(spec, page_size, ComponentType.SWA))
        hybrid.update(sliding_window=spec.sliding_window, swa_layout=layouts[-1])
    if ComponentType.MAMBA in kinds:
        state = StateLayout(shapes=spec.state_shapes, dtype=spec.dtype)
        hybrid.update(mamba_num_states=max(16, num_tokens // (4 * page_size)), state_layout=state)
    fingerprint = "|".join([x.fingerprint(PoolName.SWA if i else PoolName.KV)
                            for i, x in enumerate(layouts)]
                           + ([hybrid["state_layout"].fingerprint()] if "state_layout" in hybrid
                              else []))
    return CacheConfig(page_size=page_size, num_tokens=-(-num_tokens // page_size) * page_size,
                       kv_layout=layouts[0], enable_external_cache_linker=linker,
                       namespace=Namespace(model=spec.fingerprint(), layout=fingerprint),
                       **hybrid)
