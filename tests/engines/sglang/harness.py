"""SGLang nodes on CPU pools for the linker tests: SGLang's own UnifiedRadixCache, its linker
wrapper, and RadixlinkLinker made by SGLang's linker factory, driven the way SGLang's
scheduler drives them.

Node A serves a prompt (its KV is random, seeded), inserts it, and the tree's write-through
offloads it through the linker. Node B restores the same prompt through the scheduler's call
sequence (``restore``); the test compares B's slots with A's.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass, field
from typing import Any

import torch
from sglang.srt.managers.schedule_batch import ReqKvInfo
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import (
    InitLoadBackParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import (
    HybridLinearKVPool,
    HybridReqToTokenPool,
    MHATokenToKVPool,
    ReqToTokenPool,
)
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.linker_factory import create_unified_cache_linker
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

LINKER_MODULE = "radixlink.integrations.sglang.linker"
DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Shape:
    """A small model's cache: which components, page size, layers (which are full attention)."""

    components: tuple[ComponentType, ...] = (ComponentType.FULL,)
    page_size: int = 4
    num_layers: int = 4
    full_layers: tuple[int, ...] = (1, 3)
    window: int = 8  # SWA window in tokens
    kv_size: int = 512
    head_num: int = 2
    head_dim: int = 8

    @property
    def other_layers(self) -> list[int]:
        return [i for i in range(self.num_layers) if i not in self.full_layers]


FULL = Shape()
FULL_SWA = Shape(components=(ComponentType.FULL, ComponentType.SWA))
FULL_MAMBA = Shape(components=(ComponentType.FULL, ComponentType.MAMBA))


@dataclass
class SchedRequest:
    """The fields of SGLang's ``Req`` that UnifiedRadixCache and its linker wrapper read."""

    rid: str
    kv: ReqKvInfo = field(default_factory=ReqKvInfo)
    last_node: Any = None
    swa_branching_seqlen: int | None = None
    session: Any = None
    extra_key: str | None = None
    prefix_len: int = 0


@dataclass
class Restore:
    """What node B's scheduler ended with for one request."""

    device_len: int  # tokens matched on device
    loaded_len: int  # tokens the linker loaded (0 = nothing restorable)
    slots: torch.Tensor  # full-pool slots of the whole prefix
    failed: bool  # finish_external_linker_loads reported the load failed
    request: SchedRequest


class Node:
    """One SGLang cache with the radixlink linker on ``store_url``."""

    def __init__(self, shape: Shape, store_url: str, *, seed: int = 0) -> None:
        self.shape = shape
        self.gen = torch.Generator().manual_seed(seed)
        server_args = ServerArgs(model_path="dummy", page_size=shape.page_size)
        server_args._mamba_cache_chunk_size = 64
        set_global_server_args_for_scheduler(server_args)
        self.req_pool, self.kvcache, self.allocator = _build_pools(shape)
        self.params = CacheInitParams(
            req_to_token_pool=self.req_pool,
            token_to_kv_pool_allocator=self.allocator,
            page_size=shape.page_size,
            disable=False,
            sliding_window_size=shape.window if ComponentType.SWA in shape.components else None,
            tree_components=shape.components,
            enable_mamba_extra_buffer=ComponentType.MAMBA in shape.components,
        )
        self.cache = UnifiedRadixCache(params=self.params)
        # The calls of sglang/srt/mem_cache/registry.py::create_unified_radix_cache (l. 198-218).
        self.cache.init_cache_linker(
            create_unified_cache_linker(
                server_args,
                self.params,
                backend="dynamic",
                config={
                    "linker": "RadixlinkLinker",
                    "linker_module_path": LINKER_MODULE,
                    "linker_extra_config": {"store": store_url},
                },
                components=set(self.cache.components),
            )
        )
        self.counter = self.cache.linker.layer_done_counter
        self.kvcache.register_layer_transfer_counter(self.counter)

    @property
    def linker(self) -> Any:
        return self.cache.linker.cache_linker

    def serve(self, tokens: list[int]) -> torch.Tensor:
        """Compute-and-cache ``tokens``: fresh slots with random KV, inserted into the tree
        (which offloads them); returns the full-pool slots after the offloads landed."""
        slots = self._alloc(len(tokens))
        self._fill(slots)
        params = InsertParams(key=RadixKey(array("q", tokens)), value=slots)
        if ComponentType.MAMBA in self.shape.components:
            state = self.req_pool.mamba_allocator.alloc(1)
            self._fill_state(state)
            params.mamba_value = state
            self.state_slot = state
        self.cache.insert(params)
        self.wait_offloads()
        return slots

    def wait_offloads(self, timeout_s: float = 10.0) -> None:
        """Poll as the scheduler does each step (``check_hicache_events``) until no offload is
        pending."""
        deadline = time.monotonic() + timeout_s
        while self.cache.linker.pending_offloads:
            assert time.monotonic() < deadline, "offloads did not complete"
            self.cache.check_hicache_events()
            time.sleep(0.005)

    def restore(self, tokens: list[int], rid: str) -> Restore:
        """One request alone in a batch (see ``admit`` and ``run_batch``)."""
        admitted = self.admit(tokens, rid)
        self.run_batch([admitted])
        return admitted

    def admit(self, tokens: list[int], rid: str) -> Restore:
        """Admission as the scheduler does it: match (LOOKUP) and init_load_back (LOAD +
        PREPARE); the slots of the whole prefix are read before the batch runs."""
        req = SchedRequest(rid=rid)
        key = RadixKey(array("q", tokens))
        # schedule_batch.py Req.init_next_round_input -> match_kv_cache
        match = self.cache.match_prefix(MatchPrefixParams(key=key, req=req))
        req.last_node = match.last_device_node
        req.prefix_len = match.device_prefix_len
        loaded = 0
        if match.host_hit_length > 0:
            # schedule_policy.py l. 1517-1525
            loaded, req.last_node = self.cache.init_load_back(
                InitLoadBackParams(
                    best_match_node=match.best_match_node,
                    host_hit_length=match.host_hit_length,
                    req=req,
                )
            )
        req.prefix_len += loaded
        slots = self.cache.prefix_device_indices(req)  # unified_radix_cache.py l. 3955
        return Restore(
            device_len=match.device_prefix_len, loaded_len=loaded, slots=slots, failed=False,
            request=req,
        )

    def run_batch(self, batch: list[Restore]) -> None:
        """One forward over ``batch``: ready_to_load_host_cache starts the loads, the model
        waits per layer, finish_external_linker_loads names the requests whose KV did not
        land (each gets ``failed``)."""
        index = self.cache.ready_to_load_host_cache()  # scheduler.py l. 4353
        self._forward(index)
        failed = self.cache.finish_external_linker_loads([r.request for r in batch])
        failed_rids = {req.rid for req in failed}  # scheduler.py l. 4927
        for restore in batch:
            restore.failed = restore.request.rid in failed_rids

    def release(self, restore: Restore) -> None:
        """What the scheduler does with a failed request's private slots: free them."""
        private = restore.slots[restore.device_len :]
        if private.numel():
            self.allocator.free(private)

    def full_bytes(self, slots: torch.Tensor) -> list[torch.Tensor]:
        """The full-attention K/V rows of ``slots``, every full layer."""
        pool = self._full_pool()
        return [b[slots].clone() for b in (*pool.k_buffer, *pool.v_buffer)]

    def swa_bytes(self, slots: torch.Tensor) -> list[torch.Tensor]:
        """The SWA K/V rows behind full-pool ``slots``."""
        rows = self.allocator.translate_loc_from_full_to_swa(slots)
        pool = self.kvcache.swa_kv_pool
        return [b[rows].clone() for b in (*pool.k_buffer, *pool.v_buffer)]

    def state_bytes(self, slot: torch.Tensor) -> list[torch.Tensor]:
        cache = self.req_pool.mamba_pool.mamba_cache
        return [s[:, slot].clone() for s in (cache.temporal, *cache.conv)]

    def close(self) -> None:
        self.cache.linker.close()

    def _forward(self, index: int) -> None:
        """The model's reads: the counter is set by tp_worker.py l. 545, and each layer's KV
        read waits on it (memory_pool.py l. 1674-1683, 2856-2878)."""
        if index < 0:
            return
        self.counter.set_consumer(index)
        for layer in range(self.shape.num_layers):
            self.counter.wait_until(layer)

    def _alloc(self, num_tokens: int) -> torch.Tensor:
        if ComponentType.SWA not in self.shape.components:
            slots = self.allocator.alloc(num_tokens)
            assert slots is not None, "node out of KV slots"
            return slots
        # NOTE: SWATokenToKVPoolAllocator.alloc is page-1 only; this is its body on the
        # paged sub-allocators (the scheduler uses alloc_extend, which needs a request row).
        full = self.allocator.full_attn_allocator.alloc(num_tokens)
        swa = self.allocator.swa_attn_allocator.alloc(num_tokens)
        assert full is not None and swa is not None, "node out of KV slots"
        self.allocator.set_full_to_swa_mapping(full, swa)
        return full

    def _full_pool(self) -> Any:
        return getattr(self.kvcache, "full_kv_pool", self.kvcache)

    def _fill(self, slots: torch.Tensor) -> None:
        pool = self._full_pool()
        for buf in (*pool.k_buffer, *pool.v_buffer):
            buf[slots] = self._random(len(slots), *buf.shape[1:])
        if ComponentType.SWA in self.shape.components:
            rows = self.allocator.translate_loc_from_full_to_swa(slots)
            swa = self.kvcache.swa_kv_pool
            for buf in (*swa.k_buffer, *swa.v_buffer):
                buf[rows] = self._random(len(rows), *buf.shape[1:])

    def _fill_state(self, slot: torch.Tensor) -> None:
        cache = self.req_pool.mamba_pool.mamba_cache
        for state in (cache.temporal, *cache.conv):
            state[:, slot] = self._random(state.shape[0], len(slot), *state.shape[2:]).to(
                state.dtype
            )

    def _random(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen).to(DTYPE)


def _build_pools(shape: Shape) -> tuple[Any, Any, Any]:
    """SGLang's CPU pools, built as its own unit-test fixtures build them."""
    common = {"dtype": DTYPE, "head_num": shape.head_num, "head_dim": shape.head_dim}
    if ComponentType.MAMBA in shape.components:
        from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape

        state_shape = Mamba2StateShape.create(
            tp_world_size=1, intermediate_size=64, n_groups=1, num_heads=2, head_dim=16,
            state_size=8, conv_kernel=4,
        )
        req_pool = HybridReqToTokenPool(
            size=8, mamba_size=32, mamba_spec_state_size=8, max_context_len=256, device="cpu",
            enable_memory_saver=False,
            cache_params=Mamba2CacheParams(shape=state_shape, layers=shape.other_layers),
            mamba_layer_ids=shape.other_layers, enable_mamba_extra_buffer=True,
            speculative_num_draft_tokens=3,
        )
        kvcache = HybridLinearKVPool(
            size=shape.kv_size, page_size=shape.page_size,
            full_attention_layer_ids=list(shape.full_layers), device="cpu",
            enable_memory_saver=False, mamba_pool=req_pool.mamba_pool, **common,
        )
        allocator = TokenToKVPoolAllocator(
            size=shape.kv_size, dtype=DTYPE, device="cpu", kvcache=kvcache, need_sort=False
        )
        return req_pool, kvcache, allocator
    req_pool = ReqToTokenPool(size=8, max_context_len=256, device="cpu", enable_memory_saver=False)
    if ComponentType.SWA in shape.components:
        kvcache = SWAKVPool(
            size=shape.kv_size, size_swa=shape.kv_size, page_size=shape.page_size,
            swa_attention_layer_ids=shape.other_layers,
            full_attention_layer_ids=list(shape.full_layers), device="cpu", **common,
        )
        allocator = SWATokenToKVPoolAllocator(
            size=shape.kv_size, size_swa=shape.kv_size, page_size=shape.page_size, dtype=DTYPE,
            device="cpu", kvcache=kvcache, need_sort=False,
        )
        return req_pool, kvcache, allocator
    kvcache = MHATokenToKVPool(
        size=shape.kv_size, page_size=shape.page_size, layer_num=shape.num_layers, device="cpu",
        enable_memory_saver=False, **common,
    )
    allocator = TokenToKVPoolAllocator(
        size=shape.kv_size, dtype=DTYPE, device="cpu", kvcache=kvcache, need_sort=False
    )
    return req_pool, kvcache, allocator
