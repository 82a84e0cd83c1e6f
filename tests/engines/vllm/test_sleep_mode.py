"""Sleep mode (vLLM 0.33 and 0.34: ``unregister_kv_caches`` / ``restore_kv_caches``): the
worker drops its views of the KV tensors on sleep, fails the loads it could not scatter, and
binds the views again on wake-up."""

from __future__ import annotations

import pytest

from .conftest import VLLM_MISSING  # noqa: E402, I001

pytest.importorskip("vllm", reason=VLLM_MISSING)

from radixlink.integrations.vllm import RadixlinkConnector  # noqa: E402

from .conftest import faults_url  # noqa: E402
from .test_round_trip import _first_run, _prompt  # noqa: E402


def test_sleep_mode_is_supported_where_vllm_asks(nodes, model_dir, file_url):
    """vLLM 0.33+ refuses sleep mode for a connector whose ``supports_sleep_mode`` is False;
    the connector says True (it follows the remap below)."""
    node = nodes(model_dir, file_url)
    assert RadixlinkConnector.supports_sleep_mode(node.config.kv_transfer_config) is True


def test_sleep_fails_the_unscattered_load_and_wake_up_rebinds(nodes, model_dir, file_url):
    """Flow: node 2 starts a 6-page load (from a slow store); the engine sleeps before the
    pages are scattered (the worker holds no KV views, the load is failed: its request
    recomputes every token); after wake-up (views bound again; both calls idempotent) a
    fresh node's request loads all 6 pages into the rebound tensors and the stand-in forward
    finds every token's KV as node 1 computed."""
    prompt = _prompt(80, 100)
    node1 = nodes(model_dir, file_url)
    node1.add("a", prompt)
    node1.run()
    node2 = nodes(model_dir, faults_url(file_url, delay_ms=300, ops="get"))
    node2.add("b", prompt)
    out = node2.step()  # NOTE: the slow get keeps the load from finishing inside this step
    assert out.num_scheduled_tokens == {}  # the load started
    worker = node2.workers[0]
    worker.unregister_kv_caches()
    worker.unregister_kv_caches()
    assert not worker.worker.registered
    worker.restore_kv_caches()
    worker.restore_kv_caches()
    assert worker.worker.registered
    assert _first_run(node2, "b") == (0, 100)  # the unscattered load failed
    node2.run()
    assert worker.worker.stats["failed_loads"] == 1
    node2.assert_no_leak()
    node3 = nodes(model_dir, file_url)  # a fresh node: vLLM's own prefix cache is empty
    node3.add("c", prompt)
    node3.workers[0].unregister_kv_caches()
    node3.workers[0].restore_kv_caches()
    assert _first_run(node3, "c") == (96, 4)
    node3.run()
    assert node3.workers[0].worker.stats["loaded_pages"] == 6
    assert node3.checked_tokens >= 96
    node3.assert_no_leak()
