"""The test oracle (tests/oracle.py): K/V and states depend on the whole token prefix and the
namespace, are exact in float32, agree with a scalar reference, and ``verify_tree`` rejects a
page of another history that has the same tokens at the same positions."""

from __future__ import annotations

import numpy as np
import oracle
import pytest
import serving
import torch

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import PoolName
from radixlink.hashing import Namespace
from radixlink.memory.layout import KVLayout, StateLayout

PS = 4
LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype=torch.float32, page_size=PS)
STATE = StateLayout(shapes=((2, 3), (4,)), dtype=torch.float32)
X = [1, 2, 3, 4, 50, 51, 52, 53, 9, 9, 9, 9]  # X and Y differ only on page 0
Y = [5, 6, 7, 8, 50, 51, 52, 53, 9, 9, 9, 9]


def make(namespace: Namespace | None = None, hybrid: bool = False) -> UnifiedCache:
    return UnifiedCache(CacheConfig(
        page_size=PS, num_tokens=128, kv_layout=LAYOUT, namespace=namespace,
        sliding_window=8 if hybrid else None, swa_num_tokens=128 if hybrid else None,
        swa_layout=LAYOUT if hybrid else None, mamba_num_states=8 if hybrid else None,
        state_layout=STATE if hybrid else None))


def serve(cache: UnifiedCache, tokens: list[int], namespace=None) -> None:
    states = cache.pool(PoolName.MAMBA) is not None
    served = serving.serve(
        cache, tokens, namespace=namespace,
        compute=lambda c, kv, t, start: oracle.write(c, kv[start:], t, start, namespace),
        state=(lambda t: oracle.state(cache, t, namespace)) if states else None)
    assert served.insert is not None


def reference(tokens: list[int], resolved) -> list[tuple[int, int]]:
    """The rolling hashes by the definition, one token at a time (test only)."""
    h = [int(v) for v in oracle.seed(resolved)]
    out = []
    for i, t in enumerate(tokens):
        h = [(h[j] + (t + 1) * pow(int(oracle.BASES[j]), i + 1, int(oracle.PRIMES[j])))
             % int(oracle.PRIMES[j]) for j in range(2)]
        out.append((h[0], h[1]))
    return out


def test_vectorised_hashes_equal_the_scalar_definition() -> None:
    tokens = list(np.random.default_rng(0).integers(0, 2**31 - 1, size=3000))
    for ns in (None, Namespace(model="m", cache_salt="s")):
        got = oracle.hashes(tokens, ns)
        assert [tuple(r) for r in got.tolist()] == reference(tokens, ns)
        # continuing a prefix's hashes equals hashing the whole history
        cont = oracle.extend(oracle.after(tokens[:1234], ns), tokens[1234:], 1234)
        assert np.array_equal(cont, got[1234:])


def test_values_are_small_integers_exact_in_float32() -> None:
    rows = oracle.hashes(list(range(5000)), None)
    for pool in (PoolName.KV, PoolName.SWA):
        k = oracle.kv_of(rows, pool, 2, (2, 8))
        assert k.dtype == torch.float32 and float(k.max()) < 2**20 and float(k.min()) >= 0
        assert torch.equal(k, k.double().round().float())


def test_same_tokens_and_positions_after_another_history_differ() -> None:
    """Pages 1 and 2 of X and Y hold equal (token, position) pairs: their K/V (full and SWA,
    every layer, K and V) and the states after them still differ."""
    cache = make(hybrid=True)
    a, b = cache.alloc(12), cache.alloc(12)
    oracle.write(cache, a, X, 0)
    oracle.write(cache, b, Y, 0)
    for name in (PoolName.KV, PoolName.SWA):
        pool = cache.pool(name)
        sa, sb = (a, b) if name is PoolName.KV else (cache.hybrid.swa_slots(a),
                                                     cache.hybrid.swa_slots(b))
        for layer in range(LAYOUT.num_layers):
            for t in (pool.k(layer), pool.v(layer)):
                assert bool((t[sa[4:]] != t[sb[4:]]).all()), (name, layer)
    assert oracle.kv_matches(cache, a[4:], X, 4) and not oracle.kv_matches(cache, a[4:], Y, 4)
    assert not torch.equal(oracle.state(cache, X), oracle.state(cache, Y))
    assert not torch.equal(oracle.state(cache, X[:8]), oracle.state(cache, X))


def test_two_namespaces_differ_and_layer_on_the_caches() -> None:
    """Another request namespace, or another cache namespace, changes every value; the
    request's namespace is layered on the cache's (``hashing.layer_namespaces``)."""
    plain, model = make(), make(Namespace(model="m"))
    rows = {}
    for cache, ns in ((plain, None), (plain, Namespace(cache_salt="s")), (model, None),
                      (model, Namespace(cache_salt="s"))):
        rows[(id(cache), ns)] = oracle.hashes(X, oracle.resolved(cache, ns))
    values = list(rows.values())
    for i in range(len(values)):
        for j in range(i):
            assert bool((values[i] != values[j]).all())
    slots = model.alloc(12)
    oracle.write(model, slots, X, 0, Namespace(cache_salt="s"))
    assert oracle.kv_matches(model, slots, X, 0, Namespace(cache_salt="s"))
    assert not oracle.kv_matches(model, slots, X, 0)


def test_write_refuses_slots_that_do_not_cover_the_positions() -> None:
    cache = make()
    with pytest.raises(AssertionError, match="slots for positions"):
        oracle.write(cache, cache.alloc(4), X[4:8], 4)  # the old (token, position) call


@pytest.mark.parametrize("hybrid", [False, True])
def test_verify_tree_checks_the_whole_path(hybrid: bool) -> None:
    """X's page 2 overwritten with what the model writes for Y's page 2 (the same tokens at
    the same positions): verify_tree names the node. Untouched, the tree verifies."""
    cache = make(hybrid=hybrid)
    serve(cache, X)
    serve(cache, Y)
    oracle.verify_tree(cache)
    slots = cache.match_prefix(X).device_indices
    assert oracle.served_matches(cache, cache.match_prefix(X), X)
    oracle.write(cache, slots[8:], Y, 8)
    with pytest.raises(AssertionError, match="K/V differ"):
        oracle.verify_tree(cache)
    assert not oracle.served_matches(cache, cache.match_prefix(X), X)


def test_verify_tree_checks_each_nodes_state() -> None:
    cache = make(hybrid=True)
    serve(cache, X)
    node = cache.match_prefix(X).last_node
    states = cache.pool(PoolName.MAMBA)
    states.write_state(node.values[-1], oracle.state(cache, Y))
    with pytest.raises(AssertionError, match="state differs"):
        oracle.verify_tree(cache)
