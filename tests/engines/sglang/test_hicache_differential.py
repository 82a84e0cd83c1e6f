"""RadixlinkHiCacheStorage answers presence exactly as SGLang's own file backend (HiCacheFile)
on random presence patterns of KV, SWA (window) and MAMBA (trailing state) pages."""

from __future__ import annotations

import random

import pytest

from .conftest import SGLANG_MISSING

pytest.importorskip("sglang", reason=SGLANG_MISSING)

from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)

from .hicache_harness import BACKEND, PAGE, host_pool, make_backend, page_hashes  # noqa: E402

NUM_PAGES = 8


def _backends(store_url: str, file_dir: str):
    """The radixlink backend and SGLang's file backend, each with KV, SWA and MAMBA pools."""
    kv, swa, mamba = host_pool("page_first"), host_pool("layer_first"), host_pool("page_head")
    ours = make_backend("dynamic", {**BACKEND, "store": store_url}, kv)
    theirs = make_backend("file", {"file_storage_path": file_dir}, kv)
    for backend in (ours, theirs):
        for name, pool in ((PoolName.KV, kv), (PoolName.SWA, swa), (PoolName.MAMBA, mamba)):
            backend.register_mem_host_pool_v2(pool, name)
    return ours, theirs, {PoolName.KV: kv, PoolName.SWA: swa, PoolName.MAMBA: mamba}


def _write_pattern(backends, pools, keys, rng: random.Random) -> None:
    """Store a random subset of each pool's pages, the same subset in both backends."""
    slots = {name: pool.alloc(PAGE) for name, pool in pools.items()}
    for name in pools:
        present = [k for k in keys if rng.random() < (0.85 if name == PoolName.KV else 0.6)]
        for key in present:
            for backend in backends:
                done = backend.batch_set_v2(
                    [PoolTransfer(name=name, keys=[key], host_indices=slots[name])]
                )
                assert done[name] == [True]


def _normalise(result) -> tuple:
    hits = {str(getattr(k, "value", k)): v for k, v in result.extra_pool_hit_pages.items()}
    return result.kv_hit_pages, hits, list(result.restorable_prefix_pages or [])


@pytest.mark.parametrize("seed", range(6))
def test_presence_answers_match_sglang_file_backend(store_url, tmp_path, seed) -> None:
    """Same batch_exists and batch_exists_v2 answers (KV prefix, per-pool hits, restorable
    lengths) for ALL_PAGES and TRAILING_PAGES pools and every window, on every pattern."""
    rng = random.Random(seed)
    ours, theirs, pools = _backends(store_url, str(tmp_path / "hicache-file"))
    keys = page_hashes(list(range(seed * 1000, seed * 1000 + NUM_PAGES * PAGE)))
    _write_pattern((ours, theirs), pools, keys, rng)
    assert ours.batch_exists(keys) == theirs.batch_exists(keys)
    for _ in range(12):
        n = rng.randrange(1, NUM_PAGES + 1)
        window = rng.randrange(1, 4)
        extra = [
            PoolTransfer(name=PoolName.SWA, keys=keys[:n][-window:],
                         hit_policy=rng.choice(list(PoolHitPolicy)[:2])),
            PoolTransfer(name=PoolName.MAMBA, keys=keys[:n][-1:],
                         hit_policy=PoolHitPolicy.TRAILING_PAGES),
        ]
        chosen = rng.sample(extra, rng.randrange(0, 3))
        want = _normalise(theirs.batch_exists_v2(keys[:n], chosen))
        assert _normalise(ours.batch_exists_v2(keys[:n], chosen)) == want, (n, window)
    ours.close()
