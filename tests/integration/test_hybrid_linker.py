"""The external cache linker on hybrid caches (FULL+SWA, FULL+MAMBA, FULL+SWA+MAMBA) with real
pools and a memory store: SWA windows and Mamba states go through the store byte-identically,
restorable lengths are sparse, and failures abort with exact accounting on every pool."""

from __future__ import annotations

import pytest
import torch

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import InsertParams, PoolName, PoolTransfer
from radixlink.linker.core import ExternalCacheLinker
from radixlink.memory.layout import KVLayout, StateLayout
from radixlink.stores.faults import FaultyStore
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
    """Deterministic full K/V and SWA K/V per (token, position) for ``tokens[start:]``."""
    data = torch.tensor(tokens[start:], dtype=torch.float32)[:, None, None]
    pos = torch.arange(start, len(tokens), dtype=torch.float32)[:, None, None]
    kv, swa = cache.pool(PoolName.KV), cache.pool(PoolName.SWA)
    swa_slots = None if swa is None else cache.swa_slots(slots)
    for layer in range(LAYOUT.num_layers):
        kv.k(layer)[slots] = (data * 10 + pos + layer).expand(-1, 2, 8)
        kv.v(layer)[slots] = (-data - pos - layer).expand(-1, 2, 8)
        if swa is not None:
            swa.k(layer)[swa_slots] = (data * 7 + pos * 3 + layer).expand(-1, 2, 8)
            swa.v(layer)[swa_slots] = (data - pos * 5 - layer).expand(-1, 2, 8)


def state_bytes(n: int) -> torch.Tensor:
    """The recurrent state after ``n`` tokens (as bytes): distinct per boundary."""
    return ((torch.arange(STATE.state_bytes) * 3 + n) % 251).to(torch.uint8)


def serve(cache: UnifiedCache, tokens: list[int]) -> None:
    """One request without a store load: match, compute the rest (K/V, SWA, state), insert."""
    m = cache.match_prefix(tokens)
    handle = cache.lock(m.last_node)
    if m.mamba_slot is not None:
        cache.free_state(m.mamba_slot)
    new = cache.alloc(len(tokens) - m.prefix_len)
    assert new is not None
    kv = torch.cat([m.device_indices, new])
    fill(cache, kv[m.prefix_len :], tokens, m.prefix_len)
    state = None
    if cache.pool(PoolName.MAMBA) is not None:
        state = cache.alloc_state()
        assert state is not None
        cache.pool(PoolName.MAMBA).write_state(state, state_bytes(len(tokens)))
    cache.insert(InsertParams(key=tokens, value=kv, prev_prefix_len=m.prefix_len,
                              mamba_value=state))
    cache.unlock(handle)


def window_and_state(cache: UnifiedCache, tokens: list[int]) -> list[torch.Tensor]:
    """Full K/V, SWA window K/V and Mamba state bytes of the device match of ``tokens``."""
    m = cache.match_prefix(tokens)
    out = [t[m.device_indices].clone() for layer in range(LAYOUT.num_layers)
           for t in (cache.pool(PoolName.KV).k(layer), cache.pool(PoolName.KV).v(layer))]
    if m.swa_indices is not None:
        out.append(cache.pool(PoolName.SWA).read_pages(m.swa_indices).clone())
    if m.mamba_slot is not None:
        out.append(cache.pool(PoolName.MAMBA).read_state(m.mamba_slot).clone())
        cache.free_state(m.mamba_slot)
    return out


def matched(cache: UnifiedCache, tokens: list[int]) -> int:
    """The device match length of ``tokens`` (its copy-on-write state slot freed)."""
    m = cache.match_prefix(tokens)
    if m.mamba_slot is not None:
        cache.free_state(m.mamba_slot)
    return m.prefix_len


def assert_exact(cache: UnifiedCache) -> None:
    """Invariants hold and no pool has a slot held by anyone but the tree."""
    cache.check_invariants()
    stats = cache.stats()
    assert stats["held_tokens"] == 0, stats
    assert stats.get("swa_held_tokens", 0) == 0, stats
    assert stats.get("mamba_held_states", 0) == 0, stats


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
    if m.mamba_slot is not None:
        cache.free_state(m.mamba_slot)
    assert linker.load(rid)
    out = linker.wait_load(rid, timeout=10)
    if out.match is not None and out.match.mamba_slot is not None:
        cache.free_state(out.match.mamba_slot)
    cache.unlock(out.lock)
    return m, out


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore(capacity_bytes=64 << 20)


@pytest.mark.parametrize("kind", KINDS)
def test_load_restores_full_swa_window_and_state_bytes(kind: str, store: MemoryStore) -> None:
    """B loads A's offloaded prefix: its match reaches 40 and K/V, SWA window and state equal
    A's byte for byte."""
    cache_a, _ = offloaded(kind, store)
    cache_b = make_cache(kind)
    linker_b = ExternalCacheLinker(cache_b, store)
    m, out = load(cache_b, linker_b, TOKENS)
    assert (m.prefix_len, m.external_hit_len) == (0, 40)
    assert out.ok and out.prefix_len == 40 and out.loaded_len == 40
    assert matched(cache_b, TOKENS) == 40
    for x, y in zip(window_and_state(cache_a, TOKENS), window_and_state(cache_b, TOKENS),
                    strict=True):
        assert torch.equal(x, y)
    linker_b.flush()
    assert_exact(cache_a)
    assert_exact(cache_b)


@pytest.mark.parametrize(("kind", "pool"), [("swa", PoolName.SWA), ("mamba", PoolName.MAMBA),
                                            ("swa+mamba", PoolName.SWA),
                                            ("swa+mamba", PoolName.MAMBA)])
def test_missing_window_or_state_restores_the_longest_legal_shorter_prefix(
    kind: str, pool: PoolName, store: MemoryStore
) -> None:
    """With the last page's SWA window page or Mamba state gone from the store, only the
    shorter legal prefix (20 tokens, the first node's end) is restored, byte-identical."""
    cache_a, linker_a = offloaded(kind, store)
    last = cache_a.match_prefix(TOKENS)
    if last.mamba_slot is not None:
        cache_a.free_state(last.mamba_slot)
    key = linker_a.store_keys(PoolTransfer(name=pool, keys=[last.last_node.hash_value[-1]]))
    assert store.delete(key) == 1
    cache_b = make_cache(kind)
    linker_b = ExternalCacheLinker(cache_b, store)
    m, out = load(cache_b, linker_b, TOKENS)
    assert m.external_hit_len == 20
    assert out.ok and out.prefix_len == 20
    assert matched(cache_b, TOKENS) == 20
    for x, y in zip(window_and_state(cache_a, TOKENS[:20]), window_and_state(cache_b, TOKENS),
                    strict=True):
        assert torch.equal(x, y)
    assert_exact(cache_b)


@pytest.mark.parametrize("kind", KINDS)
def test_load_after_a_device_prefix_fills_the_window_and_state(kind: str,
                                                               store: MemoryStore) -> None:
    """B holds the first 2 pages; the load brings the rest and B equals A byte for byte."""
    cache_a, _ = offloaded(kind, store)
    cache_b = make_cache(kind)
    linker_b = ExternalCacheLinker(cache_b, store)
    serve(cache_b, TOKENS[:8])
    m, out = load(cache_b, linker_b, TOKENS)
    assert (m.prefix_len, m.external_hit_len) == (8, 32)
    assert out.ok and out.prefix_len == 40 and out.loaded_len == 32
    for x, y in zip(window_and_state(cache_a, TOKENS), window_and_state(cache_b, TOKENS),
                    strict=True):
        assert torch.equal(x, y)
    linker_b.flush()
    assert_exact(cache_b)


@pytest.mark.parametrize("kind", ["swa", "swa+mamba"])
def test_window_reaching_into_the_device_prefix(kind: str, store: MemoryStore) -> None:
    """B holds 9 pages; loading the last one reserves one SWA page and the window's other
    page is B's own live data: the match reaches 40 with A's window bytes."""
    cache_a, _ = offloaded(kind, store)
    cache_b = make_cache(kind)
    linker_b = ExternalCacheLinker(cache_b, store)
    serve(cache_b, TOKENS[:36])
    m, out = load(cache_b, linker_b, TOKENS)
    assert (m.prefix_len, m.external_hit_len) == (36, 4)
    assert out.ok and out.prefix_len == 40
    for x, y in zip(window_and_state(cache_a, TOKENS), window_and_state(cache_b, TOKENS),
                    strict=True):
        assert torch.equal(x, y)
    linker_b.flush()
    assert_exact(cache_b)


@pytest.mark.parametrize("kind", KINDS)
def test_failed_get_aborts_with_exact_accounting_on_all_pools(kind: str,
                                                              store: MemoryStore) -> None:
    """A store error on get: ok=False, nothing enters the tree, every reserved full slot, SWA
    page and state slot goes back."""
    offloaded(kind, store)
    cache_b = make_cache(kind)
    linker_b = ExternalCacheLinker(cache_b, FaultyStore(store, fail=1.0, ops=("get",)))
    m, out = load(cache_b, linker_b, TOKENS)
    assert m.external_hit_len == 40
    assert not out.ok and out.prefix_len == 0 and "StoreError" in out.reason
    assert matched(cache_b, TOKENS) == 0
    assert linker_b.stats()["failures_load"] == 1
    assert_exact(cache_b)


@pytest.mark.parametrize("kind", KINDS)
def test_insert_during_load_frees_every_reserved_page_once(kind: str,
                                                           store: MemoryStore) -> None:
    """B computes the same prefix while its load is in flight: the publish adopts nothing and
    every reserved SWA page and state slot is freed exactly once."""
    offloaded(kind, store)
    cache_b = make_cache(kind)
    linker_b = ExternalCacheLinker(cache_b, FaultyStore(store, delay_ms=100, ops=("get",)))
    m = cache_b.match_prefix(TOKENS, req_id="r")
    assert m.external_hit_len == 40 and linker_b.load("r")
    serve(cache_b, TOKENS)
    out = linker_b.wait_load("r", timeout=10)
    assert out.ok and out.prefix_len == 40
    if out.match is not None and out.match.mamba_slot is not None:
        cache_b.free_state(out.match.mamba_slot)
    cache_b.unlock(out.lock)
    linker_b.flush()
    assert_exact(cache_b)


@pytest.mark.parametrize("kind", ["swa", "mamba"])
def test_no_room_for_the_window_or_state_refuses_the_load(kind: str, store: MemoryStore) -> None:
    """Every SWA page / state slot held by a request: LOAD cannot reserve, the load is refused
    and the FULL slots already reserved are freed."""
    offloaded("swa+mamba", store)
    cache_b = make_cache(kind, swa_tokens=8, num_states=1)
    linker_b = ExternalCacheLinker(cache_b, store)
    held = cache_b.alloc(8) if kind == "swa" else cache_b.alloc_state()
    assert held is not None
    assert cache_b.match_prefix(TOKENS, req_id="r").external_hit_len == 40
    assert not linker_b.load("r")
    assert linker_b.stats()["failures_prepare"] == 1
    if isinstance(held, torch.Tensor):
        cache_b.free(held)
    else:
        cache_b.free_state(held)
    assert_exact(cache_b)


def test_swa_offload_exports_only_the_trailing_window_pages(store: MemoryStore) -> None:
    """An SWA node of 5 pages puts 2 SWA pages (its window) and 5 full pages in the store."""
    cache = make_cache("swa")
    linker = ExternalCacheLinker(cache, store)
    serve(cache, TOKENS[:20])
    assert linker.flush(timeout=10)
    node = cache.match_prefix(TOKENS[:20]).last_node
    hashes = list(node.hash_value)
    swa = linker.store_keys(PoolTransfer(name=PoolName.SWA, keys=hashes))
    full = linker.store_keys(PoolTransfer(name=PoolName.KV, keys=hashes))
    assert store.exists(swa) == [False, False, False, True, True]
    assert all(store.exists(full))
