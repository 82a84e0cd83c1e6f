"""Shared kit of the hybrid linker tests: FULL / SWA / MAMBA caches with real pools, a
deterministic "model" (tests/oracle.py: K/V, SWA K/V and states as functions of the whole
prefix), one-request flows and the exact-accounting check. Owns nothing of the library."""

from __future__ import annotations

import oracle
import serving
import torch

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import PoolName
from radixlink.linker.core import ExternalCacheLinker
from radixlink.memory.layout import KVLayout, StateLayout
from radixlink.stores.memory import MemoryStore

PS = 4
WINDOW = 8  # 2 window pages
LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype=torch.float32, page_size=PS)
STATE = StateLayout(shapes=((2, 3), (4,)), dtype=torch.float32)
TOKENS = list(range(100, 140))  # 40 tokens = 10 pages; A caches 20 then 40 (two nodes)
KINDS = ("swa", "mamba", "swa+mamba")


def make_cache(kind: str, swa_tokens: int = 256, num_states: int = 16) -> UnifiedCache:
    swa, mamba = "swa" in kind, "mamba" in kind
    return UnifiedCache(CacheConfig(
        page_size=PS, num_tokens=256, kv_layout=LAYOUT, sliding_window=WINDOW if swa else None,
        swa_num_tokens=swa_tokens if swa else None, swa_layout=LAYOUT if swa else None,
        mamba_num_states=num_states if mamba else None, state_layout=STATE if mamba else None,
        enable_external_cache_linker=True,
    ))


def fill(cache: UnifiedCache, slots: torch.Tensor, tokens: list[int], start: int) -> None:
    """The model's full K/V and SWA K/V for positions ``start..`` of ``tokens`` at ``slots``
    (tests/oracle.py: a function of the whole prefix and the namespace)."""
    oracle.write(cache, slots, tokens, start)


def state_bytes(cache: UnifiedCache, tokens: list[int]) -> torch.Tensor:
    """The recurrent state after ``tokens`` (as bytes): a function of the whole prefix."""
    return oracle.state(cache, tokens)


def serve(cache: UnifiedCache, tokens: list[int]) -> None:
    """One request without a store load (tests/serving.py): K/V, SWA K/V and the state."""
    states = cache.pool(PoolName.MAMBA) is not None
    served = serving.serve(cache, tokens,
                           compute=lambda c, kv, t, start: fill(c, kv[start:], t, start),
                           state=(lambda t: state_bytes(cache, t)) if states else None)
    assert served.insert is not None, "no room for the request"


def window_and_state(cache: UnifiedCache, tokens: list[int]) -> list[torch.Tensor]:
    """Full K/V, SWA window K/V and Mamba state bytes of the device match of ``tokens``."""
    m = cache.match_prefix(tokens)
    out = [t[m.device_indices].clone() for layer in range(LAYOUT.num_layers)
           for t in (cache.pool(PoolName.KV).k(layer), cache.pool(PoolName.KV).v(layer))]
    if m.swa_indices is not None:
        out.append(cache.pool(PoolName.SWA).read_pages(m.swa_indices).clone())
    if m.mamba_slot is not None:
        out.append(cache.pool(PoolName.MAMBA).read_state(m.mamba_slot).clone())
    return out


def matched(cache: UnifiedCache, tokens: list[int]) -> int:
    """The device match length of ``tokens``."""
    return cache.match_prefix(tokens).prefix_len


def assert_exact(cache: UnifiedCache) -> None:
    """Invariants hold, no pool has a slot held by anyone but the tree, and every node holds
    the model's data for its whole path (full K/V, live SWA suffix, state)."""
    cache.check_invariants()
    stats = cache.stats()
    assert stats["held_tokens"] == 0, stats
    assert stats.get("swa_held_tokens", 0) == 0, stats
    assert stats.get("mamba_held_states", 0) == 0, stats
    oracle.verify_tree(cache)


def offloaded(kind: str, store: MemoryStore) -> tuple[UnifiedCache, ExternalCacheLinker]:
    """Cache A computes TOKENS[:20] then TOKENS (two nodes, states at 20 and 40), offloads."""
    cache_a = make_cache(kind)
    linker_a = ExternalCacheLinker(cache_a, store)
    serve(cache_a, TOKENS[:20])
    serve(cache_a, TOKENS)
    assert linker_a.flush(timeout=10)
    return cache_a, linker_a


def load(cache: UnifiedCache, linker: ExternalCacheLinker, tokens: list[int], rid: str = "r"):
    m = cache.match_prefix(tokens, req_id=rid)
    assert linker.load(rid)
    out = linker.wait_load(rid, timeout=10)
    cache.unlock(out.lock)
    return m, out
