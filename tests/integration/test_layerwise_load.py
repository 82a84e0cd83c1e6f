"""Layer-wise loading: a store load lands layer by layer (per-layer progress a forward waits
on), the reference engine computes a store-hit prefill while it lands, and the tokens equal
computing everything; a load that fails under the prefill only costs recomputation."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import torch

from radixlink.cache import UnifiedCache
from radixlink.contract import ComponentType, PoolName
from radixlink.engine.engine import Engine, cache_config
from radixlink.engine.layerwise import layer_pools
from radixlink.engine.model import ForwardInput, PagedCache
from radixlink.engine.weights import TINY_HYBRID, ByteTokenizer, random_model
from radixlink.linker.core import ExternalCacheLinker
from radixlink.linker.progress import LayerProgress
from radixlink.nocache import NoPrefixCache
from radixlink.stores.faults import FaultyStore
from radixlink.stores.memory import MemoryStore

_F, _S = ComponentType.FULL, ComponentType.SWA
TINY_FULL = dataclasses.replace(TINY_HYBRID, name="tiny-full", layer_types=(_F,) * 3)
TINY_SWA = dataclasses.replace(TINY_HYBRID, name="tiny-swa", layer_types=(_F, _S, _F, _S),
                               sliding_window=48)
TOK = ByteTokenizer()
PS = 16
TEXT = "The quick brown fox jumps over the lazy dog; a lazy dog sleeps in the sun. " * 5

pytestmark = pytest.mark.usefixtures("one_thread")


def _engine(model: object, store: object = None, *, layerwise: bool = True,
            off: bool = False) -> Engine:
    config = cache_config(model.spec, num_tokens=2048, page_size=PS,  # type: ignore[attr-defined]
                          linker=store is not None)
    if off:
        return Engine(model, TOK, NoPrefixCache(config))  # type: ignore[arg-type]
    cache = UnifiedCache(config)
    linker = None if store is None else ExternalCacheLinker(cache, store)
    return Engine(model, TOK, cache, linker, layerwise=layerwise)  # type: ignore[arg-type]


def _clean(engine: Engine) -> None:
    engine.cache.check_invariants()
    stats = engine.cache.stats()
    assert stats["held_tokens"] == 0 and stats["num_locks"] == 0, stats


@pytest.mark.parametrize("spec", [TINY_FULL, TINY_SWA], ids=["full", "full+swa"])
def test_layerwise_store_hits_generate_the_cache_off_tokens(spec: object) -> None:
    """A writer offloads three prompts; a layer-wise reader and a whole-load reader serve
    them from the store (the store hit is layer-wise only in the first) and both generate
    exactly the tokens of a cache-off engine."""
    model = random_model(spec, seed=0)  # type: ignore[arg-type]
    store = MemoryStore(256 << 20)
    writer = _engine(model, store)
    prompts = [TOK.encode(f"{i}: {TEXT}")[: 200 + 30 * i] for i in range(3)]
    for prompt in prompts:
        writer.generate(prompt, 1)
    writer.flush()
    layerwise, whole, off = _engine(model, store), _engine(model, store, layerwise=False), \
        _engine(model, off=True)
    for i, prompt in enumerate(prompts):
        a = layerwise.generate(prompt, 5, req_id=f"a{i}")
        b = whole.generate(prompt, 5, req_id=f"b{i}")
        c = off.generate(prompt, 5)
        assert a.num_from_store > 0 and a.layerwise and not b.layerwise
        assert a.output_ids == b.output_ids == c.output_ids
        assert a.num_from_store + a.num_from_device + a.num_computed == a.prompt_len
    for engine in (layerwise, whole):
        engine.flush()
        _clean(engine)


def test_landing_reports_per_layer_progress_and_the_landing_slots() -> None:
    """landing() of a load in flight gives the slots the prefix lands in and a wait per pool
    layer that returns True once each has landed; the data there is the offloaded data; the
    outcome then moves the request to the canonical slots and landing() is None."""
    model = random_model(TINY_FULL, seed=0)
    store = MemoryStore(64 << 20)
    writer = _engine(model, store)
    prompt = TOK.encode(TEXT)[:160]
    writer.generate(prompt, 1)
    writer.flush()
    source = writer.cache.match_prefix(prompt)
    pool = writer.cache.pool(PoolName.KV)
    expected = pool.read_pages(source.device_indices[:144])
    reader = _engine(model, store)
    cache, linker = reader.cache, reader.linker
    m = cache.match_prefix(prompt[:-1], req_id="r")
    assert m.external_hit_len == 144 and linker.load("r")
    landing = linker.landing("r")
    assert landing is not None and landing.prefix_len == landing.loaded_len == 144
    assert all(landing.wait_layer(PoolName.KV, layer, timeout=10) for layer in range(3))
    assert landing.wait_layer(PoolName.MAMBA, 0)  # a pool taking no part: at once
    got = cache.pool(PoolName.KV).read_pages(landing.device_indices)
    assert torch.equal(got, expected)
    out = linker.wait_load("r")
    assert out.ok and torch.equal(cache.pool(PoolName.KV).read_pages(out.device_indices),
                                  expected)
    assert linker.landing("r") is None
    cache.unlock(out.lock)
    _clean(reader)


def test_the_forward_waits_for_each_layer_before_reading_it() -> None:
    """The model calls wait_layer with layers 0, 1, 2, ... in order, each before that layer
    runs; layer_pools maps model layers to (pool, index in pool)."""
    spec = TINY_SWA
    model = random_model(spec, seed=0)
    calls: list[int] = []
    ids = torch.tensor(TOK.encode(TEXT)[:20])
    slots = torch.arange(1, 21)
    model(ForwardInput(token_ids=ids, prefix_len=0, out_slots=slots, seq_slots=slots,
                       swa_out_slots=slots, swa_seq_slots=slots, wait_layer=calls.append),
          PagedCache.allocate(spec, num_slots=32, num_swa_slots=32, num_states=1))
    assert calls == list(range(len(spec.layer_types)))
    assert layer_pools(spec) == [(PoolName.KV, 0), (PoolName.SWA, 0), (PoolName.KV, 1),
                                 (PoolName.SWA, 1)]


def test_a_load_failing_under_a_layerwise_prefill_costs_only_recomputation() -> None:
    """Every page is corrupt in the store: the layer-wise reader computes from unverified
    layers, the load then fails verification, the engine recomputes the prefix, and the
    tokens equal the cache-off run; nothing leaks."""
    model = random_model(TINY_FULL, seed=0)
    inner = MemoryStore(64 << 20)
    writer = _engine(model, inner)
    prompt = TOK.encode(TEXT)[:200]
    writer.generate(prompt, 1)
    writer.flush()
    reader = _engine(model, FaultyStore(inner, corrupt=1.0, ops=("get",)))
    res = reader.generate(prompt, 5, req_id="r")
    assert res.load_failed and res.num_from_store == 0 and res.num_computed == len(prompt)
    assert res.output_ids == _engine(model, off=True).generate(prompt, 5).output_ids
    reader.flush()
    _clean(reader)


def test_layer_progress_waits_fails_and_times_out() -> None:
    """wait blocks until the layer lands (a whole pool lands all its layers at once); fail
    releases waiters with False; a wait that runs out of time is False."""
    progress = LayerProgress({PoolName.KV: 3, PoolName.MAMBA: 0})
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(progress.wait(PoolName.KV, 1, 10)))
    waiter.start()
    progress.land(PoolName.KV, 0)
    time.sleep(0.05)
    assert not results
    progress.land(PoolName.KV, 1)
    waiter.join(timeout=10)
    assert results == [True] and not progress.complete
    assert progress.wait(PoolName.KV, 2, timeout=0.01) is False
    progress.land(PoolName.MAMBA, None)
    progress.land(PoolName.KV, None)
    assert progress.complete and progress.wait(PoolName.KV, 2) and progress.wait(PoolName.MAMBA, 0)
    failed = LayerProgress({PoolName.KV: 2})
    failed.fail()
    assert failed.wait(PoolName.KV, 0, timeout=10) is False


def test_a_load_nobody_watches_lands_whole() -> None:
    """Without landing(), the worker lands each pool in one copy: the outcome arrives with
    every layer in place and the bytes equal the offloaded ones."""
    store = MemoryStore(64 << 20)
    model = random_model(TINY_FULL, seed=0)
    writer = _engine(model, store)
    prompt = TOK.encode(TEXT)[:100]
    writer.generate(prompt, 1)
    writer.flush()
    reader = _engine(model, store, layerwise=False)
    m = reader.cache.match_prefix(prompt, req_id="r")
    assert m.external_hit_len == 96 and reader.linker.load("r")
    out = reader.linker.wait_load("r")
    assert out.ok
    got = reader.cache.pool(PoolName.KV).read_pages(out.device_indices)
    src = writer.cache.match_prefix(prompt).device_indices[:96]
    assert torch.equal(got, writer.cache.pool(PoolName.KV).read_pages(src))
    reader.cache.unlock(out.lock)
    _clean(reader)
