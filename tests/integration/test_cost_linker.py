"""The linker decides per request how much of what the store holds to load (issue #18): the
length that minimises the expected TTFT, from its cost model's estimates, possibly none. Both
sides of a break-even point computed by hand."""

from __future__ import annotations

import pytest
from faults.kit import LAYOUT, TOKENS, assert_exact, make_cache, offload, request

from radixlink.cost import Estimates, EstimateTracker, PrefillEstimate, TransferEstimate
from radixlink.linker.core import ExternalCacheLinker
from radixlink.stores.memory import MemoryStore

PREFILL = PrefillEstimate(token_s=1e-4)  # 10,000 tokens/s, no attention term, no overhead
# TOKENS are 40 tokens = 10 pages of 4; LAYOUT is 2 layers x 2 heads x 8 dims x K,V x 4 bytes
BYTES_PER_TOKEN = 2 * 2 * 8 * 2 * 4
# recompute 40 tokens: 40 x 1e-4 = 0.004 s; load 40 x 256 = 10,240 bytes (no latency):
BREAK_EVEN = 40 * BYTES_PER_TOKEN / (40 * 1e-4)  # = 2,560,000 B/s


def tracker(bytes_per_s: float) -> EstimateTracker:
    return EstimateTracker(Estimates(prefill=PREFILL, bytes_per_token=BYTES_PER_TOKEN,
                                     store=TransferEstimate(bytes_per_s=bytes_per_s)))


@pytest.mark.parametrize(("bytes_per_s", "loads"), [(BREAK_EVEN * 0.98, False),
                                                    (BREAK_EVEN * 1.02, True)])
def test_the_linker_loads_only_when_loading_beats_recomputing(bytes_per_s: float,
                                                              loads: bool) -> None:
    """Store at 2% below the hand-computed break-even (2.56 MB/s for these 40 tokens): the
    lookup reports no hit (the load is declined, counted) and the request recomputes; 2%
    above: the whole restorable prefix loads. Accounting is exact either way."""
    assert BYTES_PER_TOKEN == LAYOUT.token_bytes and BREAK_EVEN == 2_560_000
    store = MemoryStore(capacity_bytes=64 << 20)
    cache_a = make_cache()
    with ExternalCacheLinker(cache_a, store) as linker_a:
        offload(cache_a, linker_a)
    cache = make_cache()
    linker = ExternalCacheLinker(cache, store, cost_model=tracker(bytes_per_s))
    result = request(cache, linker, TOKENS, "r")
    stats = linker.stats()
    if loads:
        assert result["hit"] == 40 and result["ok"] and result["prefix"] == 40
        assert stats.get("cost_declined_loads", 0) == 0
    else:
        assert result["hit"] == 0 and result["ok"] is None and result["prefix"] == 0
        assert stats["cost_declined_loads"] == 1 and stats["cost_declined_pages"] == 10
    linker.close()
    assert_exact(cache)


def test_without_a_cost_model_the_linker_loads_everything_restorable() -> None:
    """No cost model (the default): the largest restorable length, as before."""
    store = MemoryStore(capacity_bytes=64 << 20)
    cache_a = make_cache()
    with ExternalCacheLinker(cache_a, store) as linker_a:
        offload(cache_a, linker_a)
    cache = make_cache()
    linker = ExternalCacheLinker(cache, store)
    assert request(cache, linker, TOKENS, "r")["prefix"] == 40
    linker.close()
    assert_exact(cache)
