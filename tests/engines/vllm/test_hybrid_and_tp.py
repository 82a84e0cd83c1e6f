"""Hybrid groups through SupportsHMA (full attention + sliding window) and tensor parallelism
(a page counts only when every rank holds it)."""

from __future__ import annotations

import pytest

from .conftest import VLLM_MISSING  # noqa: E402, I001

pytest.importorskip("vllm", reason=VLLM_MISSING)

from radixlink.stores import open_store  # noqa: E402

from .conftest import faults_url  # noqa: E402
from .test_round_trip import _first_run, _prompt  # noqa: E402


def test_hybrid_full_and_sliding_window_round_trip(nodes, model_dir, store_url):
    """Two groups (full + SWA, window 40 tokens = 3 pages) with vLLM's hybrid manager on: a
    partial prefix (4 pages) from the store, then the rest of the prompt partly from the
    device and partly from the store; SWA pages outside the window are never needed."""
    prompt, other = _prompt(40, 100), _prompt(41, 100)
    node1 = nodes(model_dir, store_url, hybrid=True)
    assert len(node1.scheduler.kv_cache_config.kv_cache_groups) == 2
    node1.add("a", prompt)
    node1.run()
    swa_keys = _swa_keys(store_url, prompt, pages=[0])
    with open_store(store_url) as store:  # SWA page 0 lies outside every window below
        assert store.delete(swa_keys) == 1
    node2 = nodes(model_dir, store_url, hybrid=True)
    node2.add("c", prompt[:70] + other[:30])
    assert _first_run(node2, "c") == (64, 36)  # 4 pages from the store
    node2.run()
    node2.add("b", prompt)
    assert _first_run(node2, "b") == (96, 4)  # 4 pages on device + pages 4, 5 from the store
    node2.run()
    # c: 4 full + 3 window pages; b: 2 full + 2 window pages
    assert node2.workers[0].worker.stats["loaded_pages"] == 11
    node2.assert_no_leak()


def _swa_keys(url, prompt, pages) -> list[str]:
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import hash_block_tokens

    hashes, parent = [], None
    for i in range(max(pages) + 1):
        parent = hash_block_tokens(sha256, parent, prompt[i * 16 : (i + 1) * 16])
        hashes.append(bytes(parent).hex())
    with open_store(url) as store:
        keys = [k for k, _ in store.scan("")]
    return [k for k in keys if "/swa/" in k and any(hashes[i] in k for i in pages)]


def test_hybrid_load_failure_fails_the_request_and_recomputes(nodes, model_dir, file_url):
    """With two groups vLLM takes no block-level errors: a failed hybrid load is reported as a
    failed request, which vLLM recomputes whole."""
    prompt = _prompt(42, 100)
    node1 = nodes(model_dir, file_url, hybrid=True)
    node1.add("a", prompt)
    node1.run()
    node2 = nodes(model_dir, faults_url(file_url, corrupt=1, ops="get"), hybrid=True)
    node2.add("b", prompt)
    assert _first_run(node2, "b") == (0, 100)
    node2.run()
    node2.assert_no_leak()


def test_tp2_round_trip_and_one_missing_rank_page_is_no_hit(nodes, model_dir, store_url):
    """TP=2: each rank stores its own pages; a node loads all 6. After rank 1's page 2 is
    deleted, a third node's hit stops at page 2 although rank 0 still holds pages 2..5."""
    prompt = _prompt(43, 100)
    node1 = nodes(model_dir, store_url, tp_size=2)
    node1.add("a", prompt)
    node1.run()
    node2 = nodes(model_dir, store_url, tp_size=2)
    req = node2.add("b", prompt)
    assert _first_run(node2, "b") == (96, 4)
    node2.run()
    assert [w.worker.stats["loaded_pages"] for w in node2.workers] == [6, 6]
    page2 = bytes(req.block_hashes[2]).hex()
    with open_store(store_url) as store:
        keys = [k for k, _ in store.scan("") if page2 in k]
        assert sorted(k[-2:] for k in keys) == ["r0", "r1"]
        assert store.delete([k for k in keys if k.endswith("/r1")]) == 1
    node3 = nodes(model_dir, store_url, tp_size=2)
    node3.add("c", prompt)
    assert _first_run(node3, "c") == (32, 68)
    node3.run()
    node3.assert_no_leak()
