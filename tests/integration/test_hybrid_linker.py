"""The external cache linker on hybrid caches (FULL+SWA, FULL+MAMBA, FULL+SWA+MAMBA) with real
pools and a memory store: SWA windows and Mamba states go through the store byte-identically,
restorable lengths are sparse, and failures abort with exact accounting on every pool."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from hybrid_kit import (
    KINDS,
    PS,
    TOKENS,
    assert_exact,
    load,
    make_cache,
    matched,
    offloaded,
    serve,
    window_and_state,
)

from radixlink.components.window import Window
from radixlink.contract import PoolName, PoolTransfer
from radixlink.linker.core import ExternalCacheLinker
from radixlink.stores.faults import FaultyStore
from radixlink.stores.memory import MemoryStore


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
    key = linker_a.parts.store_keys(PoolTransfer(name=pool, keys=[last.last_node.hash_value[-1]]))
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
    held = cache_b.alloc(8) if kind == "swa" else cache_b.hybrid.alloc_state()
    assert held is not None
    assert cache_b.match_prefix(TOKENS, req_id="r").external_hit_len == 40
    assert not linker_b.load("r")
    assert linker_b.stats()["failures_prepare"] == 1
    if isinstance(held, torch.Tensor):
        cache_b.free(held)
    else:
        cache_b.hybrid.free_state(held)
    assert_exact(cache_b)


def test_swa_offload_exports_only_the_trailing_window_pages(store: MemoryStore) -> None:
    """An SWA node of 5 pages puts 2 SWA pages (its window) and 5 full pages in the store."""
    cache = make_cache("swa")
    linker = ExternalCacheLinker(cache, store)
    serve(cache, TOKENS[:20])
    assert linker.flush(timeout=10)
    node = cache.match_prefix(TOKENS[:20]).last_node
    hashes = list(node.hash_value)
    swa = linker.parts.store_keys(PoolTransfer(name=PoolName.SWA, keys=hashes))
    full = linker.parts.store_keys(PoolTransfer(name=PoolName.KV, keys=hashes))
    assert store.exists(swa) == [False, False, False, True, True]
    assert all(store.exists(full))


@pytest.mark.parametrize("mutation", ["insert", "reserve"])
@pytest.mark.parametrize("kind", ["swa", "swa+mamba"])
def test_a_window_published_one_page_short_is_a_counted_logged_load_failure(
    kind: str, mutation: str, store: MemoryStore, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A publish that restores the SWA window one page short serves less than was loaded: the
    load fails loudly (ok=False with a reason, counted, logged), never ok=True with a shorter
    prefix; nothing stays held or locked, every pool's accounting is exact. Two mutations:
    the insert is told the load holds no SWA for its first window page ("insert"), or SWA's
    LOAD reserves and maps one window page fewer ("reserve")."""
    _, _ = offloaded(kind, store)
    cache_b = make_cache(kind)
    linker_b = ExternalCacheLinker(cache_b, store)
    real = cache_b.insert_loaded

    def one_page_short(params, **kw):
        return real(dataclasses.replace(params, swa_evicted_seqlen=params.swa_evicted_seqlen + PS),
                    **kw)

    if mutation == "insert":
        monkeypatch.setattr(cache_b, "insert_loaded", one_page_short)
    else:  # NOTE: after A's offload, so only B's LOAD sees the short window
        monkeypatch.setattr(Window, "trailing", lambda self, n: max(0, min(self.pages, n) - 1))
    before = linker_b.stats()
    with caplog.at_level(logging.WARNING, logger="radixlink"):
        m, out = load(cache_b, linker_b, TOKENS)
    assert m.external_hit_len == 40
    assert not out.ok and "restored" in out.reason, out
    assert (out.prefix_len, out.loaded_len) == (0, 0)
    after = linker_b.stats()
    assert after["failures_load"] == before.get("failures_load", 0) + 1
    assert after["failures_publish"] == before.get("failures_publish", 0) + 1
    assert any("restored" in r.getMessage() for r in caplog.records)
    assert not cache_b.tree.live_handles()
    linker_b.flush()
    assert_exact(cache_b)


@pytest.mark.parametrize("kind", KINDS)
def test_publish_takes_the_lookups_page_hashes_and_never_calls_the_linker_back(
    kind: str, store: MemoryStore
) -> None:
    """The publishing insert gets the hashes the lookup chained from the device prefix: it
    never asks the linker (``page_hashes_for``), and the loaded nodes carry A's hashes."""
    cache_a, _ = offloaded(kind, store)
    cache_b = make_cache(kind)
    linker_b = ExternalCacheLinker(cache_b, store)
    serve(cache_b, TOKENS[:8])  # a device prefix of 2 pages: the hashes continue its chain
    asked: list[bytes] = []
    real = cache_b._hashes_for
    cache_b._hashes_for = lambda key, ns: asked.append(key) or real(key, ns)
    m, out = load(cache_b, linker_b, TOKENS)
    assert (m.prefix_len, out.ok, out.prefix_len) == (8, True, 40)
    assert asked == []
    hashes_b = [h for n in _path(cache_b.match_prefix(TOKENS).last_node) for h in n.hash_value]
    hashes_a = [h for n in _path(cache_a.match_prefix(TOKENS).last_node) for h in n.hash_value]
    assert hashes_b == hashes_a and len(hashes_b) == 10
    linker_b.flush()
    assert_exact(cache_b)


def _path(node):
    out = []
    while node.parent is not None:
        out.append(node)
        node = node.parent
    return out[::-1]
