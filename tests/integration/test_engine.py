"""The reference engine over the real cache, linker and stores: cached prefixes (device or store)
give the same logits and tokens as computing everything; failures only cost recomputation."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixlink.cache import UnifiedCache
from radixlink.contract import ComponentType, PoolName
from radixlink.engine.engine import Engine, RequestResult, cache_config
from radixlink.engine.model import ForwardInput, HybridLM, PagedCache
from radixlink.engine.nodes import NodePool, NodeSettings
from radixlink.engine.weights import TINY_HYBRID, ByteTokenizer, random_model
from radixlink.engine.workload import (
    WorkloadSpec,
    build_workload,
    route,
    schedule,
    turn_prompt,
)
from radixlink.linker.core import ExternalCacheLinker
from radixlink.nocache import NoPrefixCache
from radixlink.stores.faults import FaultyStore
from radixlink.stores.memory import MemoryStore

TINY_FULL = dataclasses.replace(TINY_HYBRID, name="tiny-full",
                                layer_types=(ComponentType.FULL,) * 3)
TOK = ByteTokenizer()
WORKLOAD = WorkloadSpec(num_conversations=3, num_turns=3, context_tokens=160, excerpt_chars=60)
PS = 16


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_full() -> HybridLM:
    return random_model(TINY_FULL, seed=0)


def _engine(model: HybridLM, store: object = None, *, off: bool = False,
            num_tokens: int = 4096) -> Engine:
    config = cache_config(model.spec, num_tokens=num_tokens, page_size=PS,
                          linker=store is not None)
    if off:
        return Engine(model, TOK, NoPrefixCache(config))
    cache = UnifiedCache(config)
    return Engine(model, TOK, cache, None if store is None else ExternalCacheLinker(cache, store))


def _replay(engines: list[Engine], max_new: int = 6) -> dict[tuple[int, int], RequestResult]:
    """The workload, turn k+1 of a conversation on the engine after turn k's."""
    convs = build_workload(WORKLOAD, TOK)
    out: dict[tuple[int, int], RequestResult] = {}
    history: dict[int, list[int]] = {}
    for turns in schedule(WORKLOAD.num_conversations, WORKLOAD.num_turns, len(engines)):
        for node, c, k in turns:
            prompt = turn_prompt(TOK, convs[c], k, history.get(c, []))
            res = engines[node].generate(prompt, max_new, req_id=f"{c}:{k}")
            history[c] = prompt + res.output_ids
            out[(c, k)] = res
        for engine in engines:
            engine.flush()
    return out


def _assert_clean(engine: Engine) -> None:
    engine.cache.check_invariants()
    stats = engine.cache.stats()
    assert stats["held_tokens"] == 0 and stats["num_locks"] == 0, stats


def test_workload_prompts_extend_and_route_alternates() -> None:
    """Each turn's prompt is a token prefix of the next; consecutive turns change node."""
    convs = build_workload(WORKLOAD, TOK)
    assert convs == build_workload(WORKLOAD, TOK)
    assert convs[0].system == convs[2].system != convs[1].system
    p0 = turn_prompt(TOK, convs[0], 0)
    p1 = turn_prompt(TOK, convs[0], 1, p0 + [65, 66])
    assert p1[: len(p0) + 2] == p0 + [65, 66] and len(p0) > WORKLOAD.context_tokens
    assert all(route(c, k, 2) != route(c, k + 1, 2) for c in range(3) for k in range(2))
    with pytest.raises(ValueError):
        turn_prompt(TOK, convs[0], 1)


def test_cache_on_outputs_equal_cache_off(tiny_full: HybridLM) -> None:
    """Two engines sharing a store, and one device-only engine, generate exactly the tokens
    of a cache-off engine; prompts are served from device and store."""
    store = MemoryStore(capacity_bytes=256 << 20)
    shared = [_engine(tiny_full, store), _engine(tiny_full, store)]
    on = _replay(shared)
    device = _replay([_engine(tiny_full)])
    off = _replay([_engine(tiny_full, off=True)])
    assert {k: r.output_ids for k, r in on.items()} == {k: r.output_ids for k, r in off.items()}
    assert {k: r.output_ids for k, r in device.items()} == {
        k: r.output_ids for k, r in off.items()}
    assert sum(r.num_from_store for r in on.values()) > 0
    assert sum(r.num_from_device for r in on.values()) > 0
    assert sum(r.num_computed for r in on.values()) < sum(r.num_computed for r in off.values())
    for r in on.values():
        assert r.num_from_device + r.num_from_store + r.num_computed == r.prompt_len
    for engine in shared:
        _assert_clean(engine)


def test_eviction_pressure_keeps_outputs_and_accounting(tiny_full: HybridLM) -> None:
    """A device pool barely larger than one request evicts on every request (the store then
    serves what was evicted); outputs stay equal to cache-off and accounting stays exact."""
    store = MemoryStore(capacity_bytes=256 << 20)
    engines = [_engine(tiny_full, store, num_tokens=960), _engine(tiny_full, store,
                                                                  num_tokens=960)]
    on = _replay(engines)
    off = _replay([_engine(tiny_full, off=True)])
    assert {k: r.output_ids for k, r in on.items()} == {k: r.output_ids for k, r in off.items()}
    assert all(e.cache.stats()["evicted_tokens"] > 0 for e in engines)
    for engine in engines:
        _assert_clean(engine)


def test_store_prefix_prefill_logits_match_full_prefill(tiny_full: HybridLM) -> None:
    """Prefill of the suffix over K/V loaded from the store gives the full prefill's logits
    (within 1e-5). TODO(#4): SWA and Mamba layers once the cache holds their state."""
    store = MemoryStore(capacity_bytes=64 << 20)
    a, b = _engine(tiny_full, store), _engine(tiny_full, store)
    prompt = TOK.encode("The quick brown fox jumps over the lazy dog. " * 6)
    a.generate(prompt[:200], 1)
    a.flush()
    spec = tiny_full.spec
    m = b.cache.match_prefix(prompt, req_id="r")
    assert m.prefix_len == 0 and m.external_hit_len == 192
    assert b.linker.load("r")
    out = b.linker.wait_load("r")
    assert out.ok and out.loaded_len == out.prefix_len == 192
    new = b.cache.alloc(len(prompt) - out.prefix_len)
    assert new is not None
    slots = torch.cat([out.device_indices, new])[: len(prompt)]
    ids = torch.tensor(prompt)
    got = tiny_full(ForwardInput(token_ids=ids[192:], prefix_len=192, out_slots=slots[192:],
                                 seq_slots=slots), PagedCache.from_pools(
                                     spec, kv=b.cache.pool(PoolName.KV)))
    fresh = torch.arange(1, len(prompt) + 1)
    whole = tiny_full(ForwardInput(token_ids=ids, prefix_len=0, out_slots=fresh, seq_slots=fresh),
                      PagedCache.allocate(spec, num_slots=len(prompt) + 1))
    assert (got - whole[192:]).abs().max().item() <= 1e-5
    b.cache.free(new)
    b.cache.unlock(out.lock)
    _assert_clean(b)


def test_faulty_store_costs_only_recomputation(tiny_full: HybridLM) -> None:
    """With failing, corrupting and slow store calls, outputs still equal the cache-off run and
    no slot or lock leaks."""
    def faulty(seed: int) -> FaultyStore:
        return FaultyStore(inner, fail=0.3, corrupt=0.2, delay_ms=1, seed=seed)

    inner = MemoryStore(capacity_bytes=256 << 20)
    engines = [_engine(tiny_full, faulty(1)), _engine(tiny_full, faulty(2))]
    on = _replay(engines)
    off = _replay([_engine(tiny_full, off=True)])
    assert {k: r.output_ids for k, r in on.items()} == {k: r.output_ids for k, r in off.items()}
    for engine in engines:
        _assert_clean(engine)


def test_hybrid_model_runs_through_the_cache() -> None:
    """tiny-hybrid (full + SWA + Mamba) through a hybrid UnifiedCache reuses device prefixes
    and generates exactly the cache-off tokens."""
    model = random_model(TINY_HYBRID, seed=0)
    on = _replay([_engine(model)], max_new=4)
    off = _replay([_engine(model, off=True)], max_new=4)
    assert {k: r.output_ids for k, r in on.items()} == {k: r.output_ids for k, r in off.items()}
    assert sum(r.num_from_device for r in on.values()) > 0


def test_hybrid_device_prefix_logits_match_full_prefill() -> None:
    """Prefill over a cached hybrid prefix (full K/V, the SWA window, the Mamba state copy)
    gives the full prefill's logits within 1e-5."""
    model = random_model(TINY_HYBRID, seed=0)
    spec, engine = model.spec, _engine(model)
    prompt = TOK.encode("Sliding windows and recurrent states, page by page. " * 4)[:200]
    engine.generate(prompt[:130], 1)  # caches 8 pages and the state at token 128
    cache = engine.cache
    m = cache.match_prefix(prompt)
    assert m.prefix_len == 128 and m.mamba_slot is not None
    handle = cache.lock(m.last_node)
    state = cache.hybrid.copy_state(m.last_node)
    assert state is not None
    new = cache.alloc(len(prompt) - 128)
    assert new is not None
    kv = torch.cat([m.device_indices, new])[: len(prompt)]
    swa = cache.hybrid.swa_slots(kv)
    ids = torch.tensor(prompt)
    got = model(ForwardInput(token_ids=ids[128:], prefix_len=128, out_slots=kv[128:],
                             seq_slots=kv, swa_out_slots=swa[128:],
                             swa_seq_slots=swa[128 - spec.sliding_window + 1:],
                             state_slot=state), engine.pools)
    fresh = torch.arange(1, len(prompt) + 1)
    whole = model(ForwardInput(token_ids=ids, prefix_len=0, out_slots=fresh, seq_slots=fresh,
                               swa_out_slots=fresh, swa_seq_slots=fresh, state_slot=1),
                  PagedCache.allocate(spec, num_slots=len(prompt) + 1,
                                      num_swa_slots=len(prompt) + 1, num_states=1))
    assert (got - whole[128:]).abs().max().item() <= 1e-5
    cache.free(new)
    cache.hybrid.free_state(state)
    cache.unlock(handle)
    _assert_clean(engine)


def test_fully_cached_prompt_recomputes_last_page(tiny_full: HybridLM) -> None:
    """A prompt cached to its last whole page still yields logits: the last page is
    recomputed and the tree keeps its own copy."""
    engine = _engine(tiny_full)
    prompt = list(range(10, 10 + 4 * PS))
    first = engine.generate(prompt, 3)
    again = engine.generate(prompt, 3)
    assert again.output_ids == first.output_ids
    assert again.num_from_device == 3 * PS and again.num_computed == PS
    _assert_clean(engine)


def test_two_processes_share_a_directory_store(tmp_path: object) -> None:
    """Node processes share a directory store: turns computed on one node are loaded by the
    other (store tokens > 0) and outputs equal the cache-off run."""
    url = f"file://{tmp_path}?capacity=1GiB"
    settings = NodeSettings(model=TINY_FULL, workload=WORKLOAD, store_urls=(url, url),
                            num_tokens=4096, page_size=PS)
    with NodePool(settings, 2) as pool:
        on, stats = pool.run("store", 6)
        off, _ = pool.run("off", 6)
    assert {k: r.result.output_ids for k, r in on.items()} == {
        k: r.result.output_ids for k, r in off.items()}
    loaded = {node: sum(r.result.num_from_store for r in on.values() if r.node == node)
              for node in (0, 1)}
    assert loaded[0] > 0 and loaded[1] > 0, loaded
    assert all(s["linker"]["offloaded_bytes"] > 0 for s in stats.values())
    assert all(s["held_tokens"] == 0 for s in stats.values())
