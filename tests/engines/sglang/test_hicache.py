"""RadixlinkHiCacheStorage made by SGLang's backend factory, on SGLang's real host pools."""

from __future__ import annotations

import pytest

from .conftest import SGLANG_MISSING

pytest.importorskip("sglang", reason=SGLANG_MISSING)

import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer  # noqa: E402

from radixlink.integrations.sglang.hicache import RadixlinkHiCacheStorage  # noqa: E402
from radixlink.stores.registry import open_store  # noqa: E402

from .hicache_harness import (  # noqa: E402
    BACKEND,
    LAYOUTS,
    PAGE,
    fill,
    host_pool,
    make_backend,
    page_hashes,
    saved,
    tokens_of,
)

PROMPT = list(range(7, 7 + 6 * PAGE))


@pytest.mark.parametrize("writer_layout", LAYOUTS)
def test_round_trip_between_nodes_on_every_layout(store_url: str, writer_layout: str) -> None:
    """A page set by one node (any host layout) reads back byte-identical on a node of every
    layout; the factory's dynamic path builds the backend."""
    keys = page_hashes(PROMPT)
    pool_a = host_pool(writer_layout)
    a = make_backend("dynamic", {**BACKEND, "store": store_url}, pool_a)
    assert isinstance(a, RadixlinkHiCacheStorage)
    src = pool_a.alloc(len(PROMPT))
    fill(pool_a, src, seed=3)
    assert a.batch_set_v1(keys, src) == [True] * len(keys)
    assert a.batch_exists(keys) == len(keys)
    for layout in LAYOUTS:
        pool_b = host_pool(layout)
        b = make_backend("dynamic", {**BACKEND, "store": store_url}, pool_b)
        pool_b.alloc(PAGE)  # B's pages land at other host slots than A's
        dst = pool_b.alloc(len(PROMPT))
        assert b.batch_get_v1(keys, dst) == [True] * len(keys)
        assert torch.equal(tokens_of(pool_b, dst), tokens_of(pool_a, src)), layout
        b.close()
    a.close()


def test_corrupt_page_is_a_per_page_false(file_url: str) -> None:
    """A page whose bytes changed in the store reads as False; its neighbours still load."""
    node, pool, keys, src = saved(file_url, PROMPT, seed=4)
    store = open_store(file_url)
    (victim,) = [k for k, _ in store.scan() if keys[2] in k]
    blob = bytearray(store.get([victim])[0])
    blob[-1] ^= 0xFF
    store.put({victim: bytes(blob)})
    dst = pool.alloc(len(PROMPT))
    assert node.batch_get_v1(keys, dst) == [True, True, False, True, True, True]
    want, got = tokens_of(pool, src), tokens_of(pool, dst)
    assert all(torch.equal(got[i], want[i]) for i in (0, 1, 3, 4, 5))
    store.close()
    node.close()


def test_page_under_another_key_is_a_miss(file_url: str) -> None:
    """A page copied under another page's key fails its key digest: False, not data."""
    keys = page_hashes(PROMPT)
    pool = host_pool("layer_first")
    node = make_backend("dynamic", {**BACKEND, "store": file_url}, pool)
    src = pool.alloc(len(PROMPT))
    fill(pool, src, seed=5)
    assert all(node.batch_set_v1(keys, src))
    store = open_store(file_url)
    stored = dict(store.scan())
    first = next(k for k in stored if keys[0] in k)
    second = next(k for k in stored if keys[1] in k)
    store.put({second: store.get([first])[0]})
    assert node.batch_get_v1(keys[:2], pool.alloc(2 * PAGE)) == [True, False]
    store.close()
    node.close()


def test_v2_pools_round_trip(file_url: str) -> None:
    """batch_set_v2 / batch_get_v2 move each registered pool's pages by its own host slots."""
    keys = page_hashes(PROMPT)
    kv_pool, swa_pool = host_pool("page_first"), host_pool("layer_first")
    node = make_backend("dynamic", {**BACKEND, "store": file_url}, kv_pool)
    node.register_mem_host_pool_v2(kv_pool, PoolName.KV)
    node.register_mem_host_pool_v2(swa_pool, PoolName.SWA)
    kv_src, swa_src = kv_pool.alloc(len(PROMPT)), swa_pool.alloc(2 * PAGE)
    fill(kv_pool, kv_src, seed=6)
    fill(swa_pool, swa_src, seed=7)
    put = node.batch_set_v2([
        PoolTransfer(name=PoolName.KV, keys=keys, host_indices=kv_src),
        PoolTransfer(name=PoolName.SWA, keys=keys[-2:], host_indices=swa_src),
    ])
    assert put == {PoolName.KV: [True] * 6, PoolName.SWA: [True, True]}
    kv_dst, swa_dst = kv_pool.alloc(len(PROMPT)), swa_pool.alloc(2 * PAGE)
    got = node.batch_get_v2([
        PoolTransfer(name=PoolName.KV, keys=keys, host_indices=kv_dst),
        PoolTransfer(name=PoolName.SWA, keys=keys[-2:], host_indices=swa_dst),
    ])
    assert got == put
    assert torch.equal(tokens_of(kv_pool, kv_dst), tokens_of(kv_pool, kv_src))
    assert torch.equal(tokens_of(swa_pool, swa_dst), tokens_of(swa_pool, swa_src))
    node.close()


def test_mla_non_writer_skips_and_rank_keys_differ(file_url: str) -> None:
    """Non-MLA pages carry the TP rank (rank 1 does not see rank 0's pages); for MLA only the
    storage writer writes, and every rank reads the one shared page."""
    keys = page_hashes(PROMPT[:PAGE])
    pool = host_pool("page_first")
    src = pool.alloc(PAGE)
    fill(pool, src, seed=8)
    r0 = make_backend("dynamic", {**BACKEND, "store": file_url}, pool, tp_rank=0, tp_size=2)
    r1 = make_backend("dynamic", {**BACKEND, "store": file_url}, pool, tp_rank=1, tp_size=2)
    assert r0.batch_set_v1(keys, src) == [True]
    assert (r0.batch_exists(keys), r1.batch_exists(keys)) == (1, 0)
    m1 = make_backend("dynamic", {**BACKEND, "store": file_url}, pool, tp_rank=1, tp_size=2,
                      mla=True)
    m0 = make_backend("dynamic", {**BACKEND, "store": file_url}, pool, tp_rank=0, tp_size=2,
                      mla=True)
    assert m1.batch_set_v1(keys, src) == [True] and m1.batch_exists(keys) == 0
    assert m0.batch_set_v1(keys, src) == [True]
    assert (m0.batch_exists(keys), m1.batch_exists(keys)) == (1, 1)
    for node in (r0, r1, m0, m1):
        node.close()


def test_bad_config_fails_at_startup(file_url: str) -> None:
    """A typo in the extra config and a missing interface_v1 are clear errors."""
    pool = host_pool("page_first")
    with pytest.raises(ValueError, match="unknown config key"):
        make_backend("dynamic", {**BACKEND, "store": file_url, "stroe": "x"}, pool)
    no_v1 = {k: v for k, v in BACKEND.items() if k != "interface_v1"}
    with pytest.raises(ValueError, match="interface_v1"):
        make_backend("dynamic", {**no_v1, "store": file_url}, pool)
