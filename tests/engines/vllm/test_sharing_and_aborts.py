"""Requests that share blocks within one step, and aborts while loads are in flight: the cases
the stand-in forward used to skip (it checked requests one by one, so a request admitted with a
prefix-cache hit on blocks another request of the same step computes read them unwritten)."""

from __future__ import annotations

import random

import pytest

from .conftest import VLLM_MISSING  # noqa: E402, I001

pytest.importorskip("vllm", reason=VLLM_MISSING)

from vllm.v1.request import RequestStatus  # noqa: E402

from .conftest import faults_url  # noqa: E402
from .harness import BLOCK  # noqa: E402
from .test_round_trip import _prompt  # noqa: E402


def _runs(out) -> dict[str, int]:
    """Request id -> the first token it computes in this step."""
    runs = {r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs}
    cached = out.scheduled_cached_reqs
    runs.update(zip(cached.req_ids, cached.num_computed_tokens))
    return runs


@pytest.mark.parametrize("extra", [{"load": False, "save": False}, {}], ids=["off", "on"])
def test_a_request_admitted_on_blocks_computed_in_the_same_step(nodes, model_dir, file_url,
                                                                extra):
    """Flow: request a (100 tokens, 64-token chunks) computes tokens 64..100 in step 2, and
    request b, admitted in that step, gets a vLLM prefix-cache hit of 96 tokens: blocks 4 and 5
    are written by a in the very step b attends to them. With the connector off and on, every
    token b attends to holds a's KV (the real forward writes the whole batch before attention)."""
    node = nodes(model_dir, file_url, max_batched=64, extra=extra)
    a = _prompt(90, 100)
    node.add("a", a, max_tokens=3)
    node.step()
    node.add("b", a[:96] + _prompt(91, 20), max_tokens=3)
    out = node.step()
    assert _runs(out) == {"a": 64, "b": 96}, "b was not admitted on a's blocks of this step"
    node.run()
    assert node.checked_tokens >= 96 + 64
    node.assert_no_leak()


def test_requests_sharing_stored_and_local_pages_admitted_together(nodes, model_dir, file_url):
    """Flow: node 1 stores a 96-token prefix; node 2 admits four requests on it in one step
    (one loads the prefix from the store, vLLM's prefix cache gives the others nothing yet:
    the blocks are still loading), then four more once the first ones compute, which share
    the loaded and the freshly computed blocks in the same step. Every attended token holds
    the storing node's KV; no block leaks."""
    prefix = _prompt(92, 96)
    node1 = nodes(model_dir, file_url)
    node1.add("a", prefix + _prompt(93, 10), max_tokens=2)
    node1.run()
    node2 = nodes(model_dir, file_url, num_blocks=96, max_batched=128)
    for i in range(4):
        node2.add(f"b{i}", prefix + _prompt(100 + i, 40), max_tokens=3)
    node2.step()
    node2.wait_io()
    for i in range(4):
        node2.add(f"c{i}", prefix + _prompt(100 + i, 40)[:20] + _prompt(200 + i, 30),
                  max_tokens=3)
    node2.run()
    assert node2.workers[0].worker.stats["loaded_pages"] >= 6
    assert node2.checked_tokens >= 8 * 96
    node2.assert_no_leak()


@pytest.mark.parametrize("fault", ["none", "fail", "corrupt"])
def test_abort_while_a_load_is_in_flight_and_its_blocks_are_reused_at_once(
        nodes, model_dir, file_url, fault):
    """Flow: node 2's request b starts a 6-page load from a slow store (whose reads also fail
    or corrupt pages); b is aborted while the load is in flight, and request c, which needs
    every block of the small pool, arrives at once. vLLM holds b's blocks until the load
    reports; c then runs in b's former blocks, and every token c attends to holds c's own KV
    (a late scatter of b's pages into c's blocks would fail the check). Nothing leaks, and the
    store is usable after (a fresh node loads the prompt when the reads did not fail)."""
    prompt = _prompt(94, 100)
    node1 = nodes(model_dir, file_url)
    node1.add("a", prompt)
    node1.run()
    params = {"delay_ms": 300, "ops": "get"}
    if fault != "none":
        params[fault] = 1
    node2 = nodes(model_dir, faults_url(file_url, **params), num_blocks=8)
    node2.add("b", prompt, max_tokens=2)
    out = node2.step()
    assert out.num_scheduled_tokens == {}, "b's load did not start"
    b_blocks = set(node2.scheduler.kv_cache_manager.get_block_ids("b")[0])
    assert len(b_blocks) >= 6
    node2.scheduler.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    node2.add("c", _prompt(95, 7 * BLOCK - 2), max_tokens=2)  # 7 blocks: the whole pool
    c_blocks: set[int] = set()
    for _ in range(40):
        node2.step()
        node2.wait_io()
        if "c" in node2.scheduler.requests and not c_blocks:
            c_blocks = set(node2.scheduler.kv_cache_manager.get_block_ids("c")[0])
        if not node2.scheduler.requests:
            break
    assert b_blocks <= c_blocks, "c did not reuse b's blocks"
    assert node2.checked_tokens >= 7 * BLOCK - 2 - BLOCK
    node2.assert_no_leak()
    node2.run()
    node3 = nodes(model_dir, file_url)
    node3.add("d", prompt)
    node3.run()
    node3.assert_no_leak()


def test_random_aborts_with_block_reuse_on_a_faulty_store(nodes, model_dir, file_url):
    """A seeded mix on a small pool over a faulty store (calls fail, gets corrupt or truncate
    pages, every get is slow): requests on three stored prefixes arrive, and random ones are
    aborted, most while their loads are in flight, so freed blocks are reused at once. Every
    attended token holds the right KV, every block is free at the end, and the loads that ran
    were accounted (each loaded or failed)."""
    rng = random.Random(7)
    prefixes = [_prompt(300 + i, 64) for i in range(3)]
    node1 = nodes(model_dir, file_url)
    for i, p in enumerate(prefixes):
        node1.add(f"s{i}", p + _prompt(310 + i, 20), max_tokens=2)
    node1.run()
    faulty = faults_url(file_url, fail=0.15, corrupt=0.1, truncate=0.05, ops="exists,get,put",
                        seed=3)  # fmt: skip
    # NOTE: reads slower than a step even on a loaded machine, so loads stay in flight
    url = faults_url(faulty, delay_ms=150, ops="get")
    node2 = nodes(model_dir, url, num_blocks=20, max_batched=96)
    aborted_mid_load = 0
    for n in range(60):
        if len(node2.scheduler.requests) < 5:
            p = rng.choice(prefixes)[: rng.choice((32, 48, 64))]
            node2.add(f"r{n}", p + _prompt(400 + n, rng.randrange(4, 40)),
                      max_tokens=rng.randrange(1, 6))
        live = [r for r in node2.scheduler.requests.values() if not r.is_finished()]
        loading = [r for r in live if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS]
        if live and rng.random() < 0.35:
            victim = rng.choice(loading if loading and rng.random() < 0.8 else live)
            aborted_mid_load += victim.status == RequestStatus.WAITING_FOR_REMOTE_KVS
            node2.scheduler.finish_requests(victim.request_id, RequestStatus.FINISHED_ABORTED)
        node2.step()
        if n % 4 == 3:
            node2.wait_io()
    node2.run(max_steps=400)
    stats = node2.workers[0].worker.stats
    assert aborted_mid_load >= 5, (aborted_mid_load, stats)
    assert stats["loaded_pages"] > 0 and stats["failed_loads"] > 0, (aborted_mid_load, stats)
    assert node2.checked_tokens > 500, (node2.checked_tokens, stats)
    node2.assert_no_leak()
