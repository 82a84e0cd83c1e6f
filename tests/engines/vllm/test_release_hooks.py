"""The connector hooks newer vLLM releases call (0.34: ``may_load_async``, ``kv_cache_access``,
``supports_lookahead_block_hashes``; 0.32+: per-source hit metrics), and the warning for
vLLM's default ``kv_load_failure_policy``. A hook a release lacks is never called there."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from .conftest import VLLM_MISSING  # noqa: E402, I001

pytest.importorskip("vllm", reason=VLLM_MISSING)

from vllm.config import SchedulerConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorRole,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

from radixlink.integrations.vllm import RadixlinkConnector  # noqa: E402

from .conftest import faults_url  # noqa: E402
from .harness import Node, kv_cache_config, vllm_config  # noqa: E402
from .test_round_trip import _prompt  # noqa: E402

HAS_INFLIGHT_LOADS = "max_num_inflight_kv_loads" in {
    f.name for f in dataclasses.fields(SchedulerConfig)}  # fmt: skip
CONNECTOR_LOG = "radixlink.integrations.vllm.connector"


def _full_batch(node: Node, num: int, seed: int) -> None:
    """``num`` long-decoding requests on fresh prompts, stepped until all run."""
    for i in range(num):
        node.add(f"run{i}", _prompt(seed + i, 40), max_tokens=60)
    for _ in range(5):
        node.step()
        node.wait_io()
    assert len(node.scheduler.running) == num


@pytest.mark.skipif(not HAS_INFLIGHT_LOADS, reason="vLLM < 0.34 has no may_load_async")
def test_a_load_runs_while_the_running_batch_is_full(nodes, model_dir, file_url):
    """Flow (vLLM 0.34, --max-num-inflight-kv-loads 2, max 2 running): two requests fill the
    batch; b, whose 6 pages node 1 stored, arrives. Its store load starts and finishes while
    both still run (``may_load_async`` says it may load); once a slot frees, b computes only
    its last 4 tokens, and its outputs equal node 1's for the same prompt. Without the
    inflight limit vLLM looks b up only once a slot frees, so no load starts meanwhile."""
    prompt = _prompt(96, 100)
    node1 = nodes(model_dir, file_url)
    req_a = node1.add("a", prompt, max_tokens=4)
    node1.run()
    slow = faults_url(file_url, delay_ms=50, ops="get")
    node2 = nodes(model_dir, slow, sched_extra={"max_num_seqs": 2, "max_num_inflight_kv_loads": 2})
    _full_batch(node2, 2, seed=500)
    req_b = node2.add("b", prompt, max_tokens=4)
    assert node2.connector.may_load_async(req_b)
    out = node2.step()
    assert "b" not in out.num_scheduled_tokens
    assert req_b.status == RequestStatus.WAITING_FOR_REMOTE_KVS, "b's load did not start"
    node2.wait_io()
    node2.step()
    assert node2.workers[0].worker.stats["loaded_pages"] == 6
    assert {r.request_id for r in node2.scheduler.running} == {"run0", "run1"}
    first = None
    for _ in range(200):
        out = node2.step()
        node2.wait_io()
        if first is None and "b" in out.num_scheduled_tokens:
            first = [r.num_computed_tokens for r in out.scheduled_new_reqs if r.req_id == "b"]
            first = first or [out.scheduled_cached_reqs.num_computed_tokens[
                out.scheduled_cached_reqs.req_ids.index("b")]]
            first.append(out.num_scheduled_tokens["b"])
        if not node2.scheduler.requests:
            break
    assert first == [96, 4], first
    assert req_b.is_finished() and len(req_b.output_token_ids) == 4
    assert list(req_b.output_token_ids) == list(req_a.output_token_ids)
    node2.assert_no_leak()

    node3 = nodes(model_dir, slow, sched_extra={"max_num_seqs": 2})  # no inflight limit
    _full_batch(node3, 2, seed=600)
    req_c = node3.add("c", prompt, max_tokens=4)
    node3.step()
    assert req_c.status == RequestStatus.WAITING, "vLLM started a load without the limit"
    assert node3.workers[0].worker.stats["loaded_pages"] == 0


def test_may_load_async_says_no_without_a_page_or_after_a_failed_load(nodes, model_dir,
                                                                       file_url):
    """No store call: yes for a request with a whole page before its last token; no for a
    shorter one, with loads off, or once a request's load failed (never offered a hit
    again)."""
    node = nodes(model_dir, file_url)
    side = node.connector.scheduler_side
    assert side.may_load(node.add("long", _prompt(97, 17)))
    assert not side.may_load(node.add("short", _prompt(98, 16)))
    off = nodes(model_dir, file_url, extra={"load": False})
    assert not off.connector.scheduler_side.may_load(off.add("x", _prompt(97, 40)))
    node1 = nodes(model_dir, file_url)
    node1.add("a", _prompt(99, 60))
    node1.run()
    bad = nodes(model_dir, faults_url(file_url, fail=1, ops="get"))
    req = bad.add("b", _prompt(99, 60))
    assert bad.connector.scheduler_side.may_load(req)
    bad.step()
    bad.wait_io()
    bad.step()
    assert bad.workers[0].worker.stats["failed_loads"] == 1
    assert not bad.connector.scheduler_side.may_load(req)
    bad.run()
    bad.assert_no_leak()


@pytest.mark.parametrize(("kind", "source"), [
    ("file", CacheHitSource.DISK),
    ("faults", CacheHitSource.DISK),
    ("redis", CacheHitSource.EXTERNAL_UNSPECIFIED),
])  # fmt: skip
def test_store_hits_count_under_the_stores_tier(nodes, model_dir, file_url, kind, source,
                                                request):
    """vLLM's per-source connector hit metrics (``hits_by_source``) count node 2's 96 loaded
    tokens under the store's tier: disk for a directory (also under faults://), the remote
    tier (external_unspecified) for Redis."""
    url = {"file": file_url, "faults": faults_url(file_url, delay_ms=1),
           "redis": None}[kind] or request.getfixturevalue("redis_url")
    prompt = _prompt(101, 100)
    node1 = nodes(model_dir, url)
    node1.add("a", prompt)
    node1.run()
    node2 = nodes(model_dir, url)
    node2.add("b", prompt)
    node2.run()
    assert node2.hits_by_source == {str(source): 96}
    node2.assert_no_leak()


def test_release_hooks_answer_as_documented(model_dir, file_url):
    """On 0.34, ``kv_cache_access`` is IN_PROCESS (torch ops in the worker; any allocation)
    and lookahead block hashes stay off; on a release without a hook, vLLM's base class has
    none to call."""
    config = vllm_config(model_dir, {"store": file_url})
    transfer = config.kv_transfer_config
    assert RadixlinkConnector.supports_lookahead_block_hashes(transfer) is False
    if hasattr(KVConnectorBase_V1, "kv_cache_access"):
        from vllm.config.kv_transfer import KVCacheAccess

        access = RadixlinkConnector.kv_cache_access(transfer)
        assert access == KVCacheAccess.IN_PROCESS and not access.needs_single_chunk()
        assert config.num_hash_lookahead_tokens == 0
    for hook in ("may_load_async", "kv_cache_access", "supports_lookahead_block_hashes"):
        assert hasattr(RadixlinkConnector, hook)


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_the_fail_load_policy_is_warned_at_startup(model_dir, file_url, policy, caplog):
    """vLLM's default ``kv_load_failure_policy`` ('fail') fails a request whose store page is
    bad; the scheduler-side connector says so once, naming the setting to use."""
    config = vllm_config(model_dir, {"store": file_url})
    config.kv_transfer_config.kv_load_failure_policy = policy
    with caplog.at_level(logging.WARNING, logger=CONNECTOR_LOG):
        connector = RadixlinkConnector(config, KVConnectorRole.SCHEDULER,
                                       kv_cache_config(16, hybrid=False))
        connector.shutdown()
    warned = [r.getMessage() for r in caplog.records if "kv_load_failure_policy" in r.getMessage()]
    assert len(warned) == (policy == "fail"), warned
    if warned:
        assert '"recompute"' in warned[0]
