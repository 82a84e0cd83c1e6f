"""A damaged sliding-window page outside the window a request reads (issue 44): a load reads
only the window pages of the prefix it restores, so the damage is not found, and not healed,
until a request whose window covers that page; that request gets a counted miss, recomputes
(never wrong K/V, exact accounting), and its offload writes the page again. The same holds
for the other trailing pool, a Mamba state stored at an earlier node's end.

Store layout after A serves TOKENS[:20] then TOKENS (window 8 tokens = 2 pages; page 4 tokens):

    full pages   0 1 2 3 4 | 5 6 7 8 9
    SWA pages          3 4 |       8 9     (each node exports its own window pages only)
    damaged            ^ SWA page 3: outside TOKENS' window (8, 9), inside TOKENS[:20]'s
"""

from __future__ import annotations

from typing import Any

import oracle
import pytest
import serving
import torch
from hybrid_kit import TOKENS, assert_exact, make_cache, offloaded, window_and_state

from radixlink.contract import PoolName, PoolTransfer
from radixlink.linker.core import ExternalCacheLinker
from radixlink.stores.memory import MemoryStore

TAIL = list(range(700, 712))  # 3 pages after TOKENS[:20]: a request whose window is 3, 4
OTHER_TAIL = list(range(800, 808))


def _request(cache: Any, linker: ExternalCacheLinker, tokens: list[int],
             req_id: str) -> serving.Served:
    """The engine's flow through the linker; the "model" first checks that the full K/V it
    reuses are the model's for the whole prefix, then computes the rest (K/V, SWA K/V, and
    the state on a MAMBA cache). The served window and state are checked too."""
    def compute(c: Any, kv: torch.Tensor, toks: list[int], start: int) -> None:
        assert oracle.kv_matches(c, kv[:start], toks[:start]), "served wrong K/V"
        oracle.write(c, kv[start:], toks, start)

    states = cache.pool(PoolName.MAMBA) is not None
    served = serving.serve(cache, tokens, linker=linker, req_id=req_id, compute=compute,
                           state=(lambda t: oracle.state(cache, t)) if states else None)
    assert served.insert is not None, "no room for the request"
    out = served.load
    if out is not None and out.ok:
        assert oracle.served_matches(cache, out.match, tokens), "served a wrong window or state"
    return served


@pytest.mark.parametrize(("kind", "pool", "page"), [
    ("swa", PoolName.SWA, 3), ("swa+mamba", PoolName.SWA, 3),
    ("mamba", PoolName.MAMBA, 4), ("swa+mamba", PoolName.MAMBA, 4),
])
def test_damaged_out_of_window_swa_page_is_a_miss_when_needed_then_healed(
    kind: str, pool: PoolName, page: int
) -> None:
    """Flow: A offloads TOKENS[:20] and TOKENS; SWA page 3 gets one flipped byte (or, the
    same for the other trailing pool, the Mamba state stored at page 4, the end of
    TOKENS[:20]). B loads TOKENS (window pages 8, 9, the state at 9): ok, the damaged page is
    never read, it stays damaged in the store and no miss is counted. B then serves
    TOKENS[:20] + TAIL, whose restored window is pages 3, 4 (state at 4): the load reads the
    damaged page, counts one checksum miss and fails; B recomputes all 32 tokens (no wrong
    K/V, exact accounting); its write-through offload writes the SWA page again, byte-identical
    to A's (a state comes back with B's next request that ends at 20, once B revalidates its
    stored mark: the first one computed the state at its own end). C, a fresh cache, then
    loads TOKENS[:20] through the healed page."""
    store = MemoryStore(capacity_bytes=64 << 20)
    cache_a, linker_a = offloaded(kind, store)
    hashes = list(cache_a.match_prefix(TOKENS[:20]).last_node.hash_value)
    keys = linker_a.parts.store_keys(PoolTransfer(name=pool, keys=hashes))
    stored = [False, False, False, True, True] if pool is PoolName.SWA else [False] * 4 + [True]
    assert store.exists(keys) == stored
    key = keys[page]
    [good] = store.get([key])
    damaged = bytearray(good)
    damaged[-1] ^= 0xFF
    assert store.put({key: bytes(damaged)}) == [True]

    cache_b = make_cache(kind)
    linker_b = ExternalCacheLinker(cache_b, store, revalidate_after_s=0.0)
    whole = _request(cache_b, linker_b, TOKENS, "whole")
    assert whole.load is not None and whole.load.ok and whole.prefix_len == 40, whole
    for x, y in zip(window_and_state(cache_a, TOKENS), window_and_state(cache_b, TOKENS),
                    strict=True):
        assert torch.equal(x, y)
    assert linker_b.flush(timeout=10)
    assert linker_b.stats()["codec_misses"]["misses"] == 0  # page 3 was never read...
    assert store.get([key]) == [bytes(damaged)]  # ...so it is still damaged

    # B holds the full K/V of TOKENS[:20] but no window at 20 (out of TOKENS' window)
    assert cache_b.match_prefix(TOKENS[:20] + TAIL).prefix_len == 0
    offloaded_before = linker_b.stats().get("offloaded_pages", 0)
    needs = _request(cache_b, linker_b, TOKENS[:20] + TAIL, "needs-page-3")
    assert needs.hit_len == 20 and needs.load is not None and not needs.load.ok, needs
    assert needs.prefix_len == 0  # recomputed: 32 tokens, nothing from the store
    misses = linker_b.stats()["codec_misses"]
    assert misses["checksum"] == 1 and misses["misses"] == 1, misses
    assert linker_b.stats()["failures_load"] == 1
    assert linker_b.flush(timeout=10)
    # bounded: at most the recomputed request's own pages went out again: 8 full pages, the
    # windows of its two nodes (2 SWA pages each) and, on a MAMBA cache, their 2 states
    assert linker_b.stats()["offloaded_pages"] - offloaded_before <= 8 + 2 * 2 + 2
    if pool is PoolName.MAMBA:
        # NOTE: the request computed the state at its own end (32), not at 20: the bad state
        # is deleted (later lookups stop reporting it) and comes back with the next request
        # that ends at 20, once B re-checks its stored mark on that node (revalidate_after_s:
        # 0 here, 300 s by default; the same as for a state the store evicted)
        assert store.exists([key]) == [False]
        again = _request(cache_b, linker_b, TOKENS[:20], "ends-at-20")
        assert again.hit_len == 0 and again.prefix_len == 0, again
        assert linker_b.flush(timeout=10)
    assert store.get([key]) == [good]  # healed by a recompute's offload, byte-identical
    assert_exact(cache_b)

    cache_c = make_cache(kind)
    linker_c = ExternalCacheLinker(cache_c, store)
    healed = _request(cache_c, linker_c, TOKENS[:20] + OTHER_TAIL, "healed")
    assert healed.load is not None and healed.load.ok and healed.prefix_len == 20, healed
    assert linker_c.stats()["codec_misses"]["misses"] == 0
    for x, y in zip(window_and_state(cache_a, TOKENS[:20]),
                    window_and_state(cache_c, TOKENS[:20]), strict=True):
        assert torch.equal(x, y)
    for linker in (linker_a, linker_b, linker_c):
        linker.close()
    for cache in (cache_a, cache_b, cache_c):
        assert_exact(cache)
