"""Insert validates its value at the facade (issue #14, item 3): slots the caller does not hold
are refused with a ValueError naming the first bad slot and the rule, before anything changes;
the tree never adopts a page someone else will be handed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import InsertParams
from radixlink.memory.layout import KVLayout

PS = 4
LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=4, dtype=torch.float32, page_size=PS)


def make(**kw: Any) -> UnifiedCache:
    return UnifiedCache(CacheConfig(page_size=PS, num_tokens=64, **kw))


def snapshot(cache: UnifiedCache) -> dict[str, Any]:
    stats = cache.stats()
    return {k: v for k, v in stats.items() if k not in ("match_calls", "match_tokens")}


def _cases(cache: UnifiedCache) -> dict[str, tuple[torch.Tensor, str]]:
    held = cache.alloc(8)
    assert held is not None
    free = torch.arange(56, 64)  # pages 14, 15: never handed out
    return {
        "free pages": (free, "is free"),
        "the padding page": (torch.cat([torch.arange(0, 4), held[:4]]), "outside the pool"),
        "negative slots": (torch.arange(-8, 0), "outside the pool"),
        "out of range": (torch.arange(64, 72), "outside the pool"),
        "a page twice": (torch.cat([held[:4], held[:4]]), "appears twice"),
        "a permuted page": (torch.cat([held[:4].flip(0), held[4:]]), "page-aligned run"),
        "a shifted run": (held + 1, "page-aligned run"),
    }


@pytest.mark.parametrize("case", ["free pages", "the padding page", "negative slots",
                                  "out of range", "a page twice", "a permuted page",
                                  "a shifted run"])
def test_insert_refuses_slots_the_caller_does_not_hold(case: str) -> None:
    """Each kind of bad slot is a ValueError naming the rule; stats, invariants and the free
    list are unchanged (the old insert adopted them, or raised IndexError from deep inside)."""
    cache = make()
    value, rule = _cases(cache)[case]
    before = snapshot(cache)
    with pytest.raises(ValueError, match=rule):
        cache.insert(InsertParams(key=list(range(8)), value=value))
    assert snapshot(cache) == before
    cache.check_invariants()


def test_adopting_free_pages_can_no_longer_corrupt_another_request() -> None:
    """Scenario of the report: free pages inserted as a prefix were later handed to another
    request by alloc, which overwrote the cached prefix's K/V. Now the insert is refused and
    nothing is cached."""
    cache = make()
    with pytest.raises(ValueError, match="is free"):
        cache.insert(InsertParams(key=list(range(8)), value=torch.arange(8, 16)))
    assert cache.match_prefix(list(range(8))).prefix_len == 0
    cache.check_invariants()


def test_prefix_slots_must_be_the_trees_own() -> None:
    """value[:prev_prefix_len] must be tree-owned pages (insert); for a linker's publish
    (insert_loaded) exactly the tree's slots for those tokens, in order."""
    cache = make()
    seq = list(range(16))
    kv = cache.alloc(16)
    cache.insert(InsertParams(key=seq, value=kv))
    m = cache.match_prefix(seq + [99] * 8)
    handle = cache.lock(m.last_node)
    new, held = cache.alloc(8), cache.alloc(16)
    before = snapshot(cache)
    with pytest.raises(ValueError, match="does not own"):
        cache.insert(InsertParams(key=seq + [99] * 8, value=torch.cat([held, new]),
                                  prev_prefix_len=16))
    permuted = torch.cat([m.device_indices[8:], m.device_indices[:8], new])
    with pytest.raises(ValueError, match="differs from the tree's slots"):
        cache.insert_loaded(InsertParams(key=seq + [99] * 8, value=permuted, prev_prefix_len=16))
    assert snapshot(cache) == before
    cache.insert(InsertParams(key=seq + [99] * 8, value=torch.cat([m.device_indices, new]),
                              prev_prefix_len=16))
    cache.free(held)
    cache.unlock(handle)
    cache.check_invariants()


@pytest.mark.parametrize("prefix", ["negative", "past the pool"])
def test_prefix_slots_outside_the_pool_are_refused(prefix: str) -> None:
    """value[:prev_prefix_len] outside the pool is a ValueError, not an IndexError (past the
    pool) and never a pass: a negative slot's page id used to wrap to the last page, which
    the tree owned, and the insert went through with slot -4 in its key's value."""
    cache = make()
    kv = cache.alloc(64)  # every page: the last one is the tree's below
    cache.insert(InsertParams(key=list(range(64)), value=kv))
    bad = torch.arange(-4, 0) if prefix == "negative" else torch.arange(68, 72)
    m = cache.match_prefix(list(range(64)))
    handle = cache.lock(m.last_node)
    before = snapshot(cache)
    with pytest.raises(ValueError, match="does not own"):
        cache.insert(InsertParams(key=[7, 7, 7, 7], value=bad, prev_prefix_len=4))
    assert snapshot(cache) == before
    cache.unlock(handle)
    cache.check_invariants()


def test_permuted_slots_with_a_linker_are_refused_before_anything_changes() -> None:
    """With a linker attached, permuted slots used to be adopted and then a ValueError escaped
    insert, leaving a prefix every later insert choked on; now the first insert is refused and
    a correct one extends the prefix."""
    from radixlink.linker.core import ExternalCacheLinker
    from radixlink.stores.memory import MemoryStore

    cache = make(kv_layout=LAYOUT, enable_external_cache_linker=True)
    linker = ExternalCacheLinker(cache, MemoryStore())
    kv = cache.alloc(8)
    with pytest.raises(ValueError, match="page-aligned run"):
        cache.insert(InsertParams(key=list(range(8)), value=kv.flip(0)))
    cache.insert(InsertParams(key=list(range(8)), value=kv))
    more = cache.alloc(8)
    m = cache.match_prefix(list(range(16)))
    cache.insert(InsertParams(key=list(range(16)), value=torch.cat([m.device_indices, more]),
                              prev_prefix_len=m.prefix_len))
    assert cache.match_prefix(list(range(16))).prefix_len == 16
    linker.close()
    cache.check_invariants()


@pytest.mark.parametrize("device", ["cpu", "cpu:0"])
def test_cpu_device_spellings_are_one_device(device: str) -> None:
    """#14.8: CacheConfig(device="cpu:0") used to make free/insert reject the cache's own slots
    ("slots is on cpu, the cache is on cpu:0"); devices are normalised once."""
    cache = make(device=device)
    kv = cache.alloc(12)
    cache.insert(InsertParams(key=list(range(8)), value=kv[:8]))
    cache.free(kv[8:])
    assert cache.device == torch.device("cpu")
    cache.check_invariants()


@pytest.mark.gpu
def test_cuda_device_spellings_are_one_device() -> None:
    """#14.8 on a GPU: device="cuda" and tensors on cuda:<current> compare equal."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    cache = make(device="cuda")
    kv = cache.alloc(12)
    cache.insert(InsertParams(key=list(range(8)), value=kv[:8]))
    cache.free(kv[8:])
    assert cache.device == torch.device("cuda", torch.cuda.current_device())
    cache.check_invariants()


@pytest.mark.parametrize("flag, value", [("chunked", "yes"), ("chunked", 1),
                                         ("track_adopted_ranges", "no"),
                                         ("track_adopted_ranges", None)])
def test_insert_flags_must_be_booleans(flag: str, value: Any) -> None:
    """A flag of InsertParams that is not True or False (the string "no" is truthy) is a
    ValueError naming it, before anything changes; a numpy bool passes."""
    cache = make()
    slots = cache.alloc(8)
    before = snapshot(cache)
    with pytest.raises(ValueError, match=f"InsertParams.{flag} must be True or False"):
        cache.insert(InsertParams(key=list(range(8)), value=slots, **{flag: value}))
    assert snapshot(cache) == before
    result = cache.insert(InsertParams(key=list(range(8)), value=slots, **{flag: np.False_}))
    assert result.prefix_len == 0 and cache.match_prefix(list(range(8))).prefix_len == 8
    cache.check_invariants()


def test_attach_linker_refuses_an_object_without_the_hooks() -> None:
    """attach_linker(<not a linker>) is a ValueError naming the missing hooks; it used to
    attach, and the next insert raised AttributeError after the tree had adopted the slots."""
    cache = make(kv_layout=LAYOUT, enable_external_cache_linker=True)
    with pytest.raises(ValueError, match="lacks lookup, on_insert, before_evict"):
        cache.attach_linker(object())
    slots = cache.alloc(8)
    assert cache.insert(InsertParams(key=list(range(8)), value=slots)).prefix_len == 0
    cache.check_invariants()
