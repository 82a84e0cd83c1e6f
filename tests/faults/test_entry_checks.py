"""Bad arguments at the public linker and cache entries (issue #24, items 4 and 11): each is a
ValueError naming the value, raised before anything changes, so no lock, reservation or
remembered lookup is left behind."""

from __future__ import annotations

import math

import pytest
import torch

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.linker.breaker import BreakerConfig
from radixlink.linker.config import LinkerConfig
from radixlink.linker.core import ExternalCacheLinker
from radixlink.memory.layout import KVLayout, StateLayout
from radixlink.stores.memory import MemoryStore

from .kit import LAYOUT, PS, TOKENS, assert_exact, make_cache, offload

BAD_TIMEOUTS = ["5", math.nan, -1.0, 0, True]


def _stored_lookup(req_id: object = "r") -> tuple[UnifiedCache, ExternalCacheLinker]:
    """A second cache whose store holds TOKENS, with a lookup remembered for ``req_id``."""
    store = MemoryStore()
    writer = make_cache()
    with ExternalCacheLinker(writer, store) as linker:
        offload(writer, linker)
    cache = make_cache()
    linker = ExternalCacheLinker(cache, store)
    assert cache.match_prefix(TOKENS, req_id=req_id).external_hit_len == len(TOKENS)
    return cache, linker


@pytest.mark.parametrize("timeout_s", BAD_TIMEOUTS)
def test_bad_load_timeout_is_refused_before_locking(timeout_s: object) -> None:
    """load(timeout_s=<not a positive number>) is a ValueError that locks nothing: after
    close() no lock remains and evict frees every cached token."""
    cache, linker = _stored_lookup()
    with pytest.raises(ValueError, match="timeout_s"):
        linker.load("r", timeout_s=timeout_s)
    assert cache.stats()["num_locks"] == 0
    assert linker.load("r", timeout_s=30.0), "the lookup is still there to load"
    outcome = linker.wait_load("r", timeout=30)
    assert outcome.ok
    cache.unlock(outcome.lock)
    linker.close()
    assert_exact(cache)
    cached = cache.stats()["cached_tokens"]
    assert cached and cache.evict(cached) == cached


@pytest.mark.parametrize("timeout", ["1", math.nan, -0.5])
def test_bad_wait_and_flush_timeouts_are_refused(timeout: object) -> None:
    """wait_load(timeout=) and flush(timeout=) take a number >= 0: anything else is a
    ValueError at the call, and the load in flight still completes afterwards."""
    cache, linker = _stored_lookup()
    assert linker.load("r")
    with pytest.raises(ValueError, match="timeout"):
        linker.wait_load("r", timeout=timeout)
    with pytest.raises(ValueError, match="timeout"):
        linker.flush(timeout=timeout)
    outcome = linker.wait_load("r", timeout=30)
    assert outcome.ok
    cache.unlock(outcome.lock)
    linker.close()
    assert_exact(cache)


def test_unhashable_req_id_is_a_value_error_at_every_entry() -> None:
    """An unhashable req_id is a ValueError at match_prefix, load, wait_load, landing and
    cancel, before the lookup (a collective with several ranks) or any lock."""
    cache, linker = _stored_lookup()
    bad: list[int] = [1]
    with pytest.raises(ValueError, match="req_id must be hashable"):
        cache.match_prefix(TOKENS, req_id=bad)
    for call in (linker.load, linker.wait_load, linker.landing, linker.cancel):
        with pytest.raises(ValueError, match="req_id must be hashable"):
            call(bad)
    assert linker.stats()["lookups"] == 1, "the refused match looked nothing up"
    linker.close()
    assert_exact(cache)


def test_observe_prefill_refuses_nan_seconds() -> None:
    """observe_prefill(seconds=nan) is refused: it would poison the cost model's estimates."""
    cache = make_cache()
    with ExternalCacheLinker(cache, MemoryStore()) as linker:
        for args in ((10, 0, math.nan), (10, 0, math.inf), (-1, 0, 0.1), (10, 0.5, 0.1)):
            with pytest.raises(ValueError):
                linker.observe_prefill(*args)


def test_free_of_slots_outside_the_pool_is_a_value_error() -> None:
    """cache.free(slots beyond the pool or negative) is a ValueError (not IndexError), and
    the pool's accounting is unchanged."""
    cache = make_cache(num_tokens=64)
    held = cache.alloc(PS)
    for slots in (torch.arange(1000, 1000 + PS), torch.arange(-PS, 0),
                  torch.cat([held, torch.arange(4096, 4096 + PS)])):
        with pytest.raises(ValueError, match="outside the pool"):
            cache.free(slots.to(torch.int64))
    cache.free(held)
    assert_exact(cache)


def test_huge_num_tokens_is_a_clear_value_error() -> None:
    """num_tokens=2**40 is a ValueError naming the size, not a raw MemoryError."""
    with pytest.raises(ValueError, match="num_tokens=1099511627776"):
        UnifiedCache(CacheConfig(page_size=PS, num_tokens=2**40, kv_layout=LAYOUT))


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex64])
def test_layouts_refuse_non_numeric_dtypes(dtype: torch.dtype) -> None:
    """KVLayout / StateLayout with dtype=bool or complex are refused."""
    with pytest.raises(ValueError, match="not bool or complex"):
        KVLayout(num_layers=1, num_kv_heads=1, head_dim=8, dtype=dtype, page_size=PS)
    with pytest.raises(ValueError, match="not bool or complex"):
        StateLayout(shapes=((4,),), dtype=dtype)


def test_linker_config_bounds_threads_and_breaker_budget() -> None:
    """num_threads above 64 and a NaN / infinite breaker budget are refused."""
    with pytest.raises(ValueError, match="num_threads=3000"):
        LinkerConfig(num_threads=3000)
    assert LinkerConfig(num_threads=64).num_threads == 64
    for value in (math.nan, math.inf):
        with pytest.raises(ValueError, match="budget_s"):
            BreakerConfig(budget_s=value)
    with pytest.raises(ValueError, match="revalidate_after_s"):
        LinkerConfig(revalidate_after_s=math.nan)


@pytest.mark.parametrize("kwargs, match", [
    ({"store": {"not": "a store"}}, r"store must be a radixlink Store or a store URL.*dict"),
    ({"store": 42}, r"store must be .*'memory://'.*int 42"),
    ({"ranks": "tp"}, r"ranks must be a RankGroup.*str"),
    ({"cost_model": object()}, r"cost_model must be a radixlink.cost.EstimateTracker"),
])  # fmt: skip
def test_linker_parts_of_another_kind_are_refused_before_attaching(kwargs: dict, match: str):
    """A store, rank group or cost model of another kind is a ValueError at construction (it
    was an AttributeError in the first lookup's store thread), and the cache is left without
    a linker, so a good one attaches afterwards."""
    cache = make_cache()
    args = {"store": MemoryStore(), **kwargs}
    store = args.pop("store")
    with pytest.raises(ValueError, match=match):
        ExternalCacheLinker(cache, store, **args)
    with ExternalCacheLinker(cache, MemoryStore()) as linker:
        offload(cache, linker)  # asserts the pages reached the store
