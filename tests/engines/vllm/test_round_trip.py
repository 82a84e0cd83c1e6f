"""RadixlinkConnector under vLLM's real Scheduler and KVCacheManager: pages one node computed are
loaded by another; every scheduled token's KV is checked against the storing node's."""

from __future__ import annotations

import os
import random

import pytest

from .conftest import VLLM_MISSING  # noqa: E402, I001

pytest.importorskip("vllm", reason=VLLM_MISSING)

from .harness import BLOCK, Node  # noqa: E402


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 1000) for _ in range(n)]


def _first_run(node: Node, req_id: str) -> tuple[int, int]:
    """Step until ``req_id`` is first computed; its (start, count) in that step."""
    for _ in range(20):
        out = node.step()
        node.wait_io()
        for new in out.scheduled_new_reqs:
            if new.req_id == req_id:
                return new.num_computed_tokens, out.num_scheduled_tokens[req_id]
        if req_id in out.scheduled_cached_reqs.req_ids:
            i = out.scheduled_cached_reqs.req_ids.index(req_id)
            start = out.scheduled_cached_reqs.num_computed_tokens[i]
            return start, out.num_scheduled_tokens[req_id]
    raise AssertionError(f"{req_id} was never scheduled")


def test_full_hit_computes_only_the_uncached_tail(nodes, model_dir, store_url):
    """Node 2 loads the 6 pages node 1 stored and computes only the last 4 of 100 tokens."""
    prompt = _prompt(0, 100)
    node1 = nodes(model_dir, store_url)
    node1.add("a", prompt)
    node1.run()
    node2 = nodes(model_dir, store_url)
    node2.add("b", prompt)
    assert _first_run(node2, "b") == (96, 4)
    node2.run()
    assert node2.workers[0].worker.stats["loaded_pages"] == 6
    assert node2.checked_tokens >= 96
    node1.assert_no_leak()
    node2.assert_no_leak()


def test_partial_prefix_loads_only_the_shared_pages(nodes, model_dir, store_url):
    """A prompt sharing 50 tokens with a stored one loads 3 pages (48 tokens) and computes the
    rest; the next page, stored under a different prefix, is never taken."""
    shared = _prompt(1, 50)
    node1 = nodes(model_dir, store_url)
    node1.add("a", shared + _prompt(2, 60))
    node1.run()
    node2 = nodes(model_dir, store_url)
    node2.add("b", shared + _prompt(3, 60))
    assert _first_run(node2, "b") == (48, 62)
    node2.run()
    node2.assert_no_leak()


def test_chunked_prefill_saves_and_loads_every_chunk(nodes, model_dir, file_url):
    """With 32-token chunks, node 1 saves each chunk's pages as they are computed; node 2,
    also chunked, loads all 12 pages of a 200-token prompt and computes the last 8 tokens."""
    prompt = _prompt(4, 200)
    node1 = nodes(model_dir, file_url, max_batched=32)
    node1.add("a", prompt, max_tokens=2)
    saved = []
    for _ in range(8):
        node1.step()
        node1.wait_io()
        saved.append(node1.workers[0].worker.stats["saved_pages"])
    node1.run()
    assert saved[:6] == [2, 4, 6, 8, 10, 12], saved  # two pages per 32-token chunk
    # every chunk after the first gathered into the staging buffer the previous save released
    assert node1.workers[0].worker.staging_stats()["staging_reuses"] >= 5
    node2 = nodes(model_dir, file_url, max_batched=32)
    node2.add("b", prompt)
    assert _first_run(node2, "b") == (192, 8)
    node2.run()
    node2.assert_no_leak()


@pytest.mark.parametrize("path", ["direct", "staging"])
def test_a_cpu_worker_streams_a_load_through_the_staging_it_reserved_at_startup(
        nodes, model_dir, file_url, monkeypatch, caplog, path):
    """On host KV a load is streamed, chunk by chunk (one page here), each chunk verified on
    a verify thread while the next is read (given a second core). From a directory store each
    page is read straight into its block (``direct``: no staging at all); else (``staging``,
    the direct read turned off) into one of the staging buffers the worker reserved when it
    registered its KV caches, then copied into its blocks. A 12-page load allocates no
    staging of its own and lands every page: node 2 computes only the last 8 tokens, with
    node 1's KV."""
    from radixlink.integrations.vllm.worker_side import ChunkLanding
    from radixlink.pages import stream

    monkeypatch.setattr(stream, "CHUNK_BYTES", 1)  # NOTE: at least one page: a page a chunk
    if path == "staging":
        monkeypatch.setattr(ChunkLanding, "targets", lambda self, span: None)
    caplog.set_level("INFO", logger="radixlink")
    prompt = _prompt(5, 200)
    node1 = nodes(model_dir, file_url)
    node1.add("a", prompt)
    node1.run()
    node2 = nodes(model_dir, file_url)
    worker = node2.workers[0].worker
    reserved = worker.staging_stats()
    one_core = len(os.sched_getaffinity(0)) == 1  # NOTE: one core: one chunk at a time
    assert reserved["staging_allocs"] == (1 if one_core else stream.STREAM_WINDOW + 1)
    node2.add("b", prompt)
    assert _first_run(node2, "b") == (192, 8)
    assert worker.stats["loaded_pages"] == 12
    assert worker.staging_stats()["staging_allocs"] == reserved["staging_allocs"]
    reuses = worker.staging_stats()["staging_reuses"] - reserved["staging_reuses"]
    assert reuses >= 12 if path == "staging" else reuses == 0
    node2.run()
    node2.assert_no_leak()
    # NOTE: the batch's log line is what `bench vllm` reads
    from radixlink.bench.vllm_load import batches

    assert [(b["pages"], b["scatter_s"]) for b in batches(caplog.text)] == [(12, 0.0)]


def test_preempted_request_resumes_with_correct_kv(nodes, model_dir, file_url):
    """Node 2's blocks run out: vLLM preempts a request that loaded pages; on resume it is
    looked up again and every token it attends to still holds node 1's KV."""
    prompts = [_prompt(10 + i, 90) for i in range(3)]
    node1 = nodes(model_dir, file_url)
    for i, p in enumerate(prompts):
        node1.add(f"a{i}", p, max_tokens=2)
    node1.run()
    node2 = nodes(model_dir, file_url, num_blocks=16)
    for i, p in enumerate(prompts):
        node2.add(f"b{i}", p + _prompt(20 + i, 8), max_tokens=40)
    node2.run(max_steps=400)
    assert node2.preemptions > 0, "the pool was large enough: nothing was preempted"
    assert node2.workers[0].worker.stats["loaded_pages"] >= 15
    node2.assert_no_leak()


def test_finished_request_holds_blocks_until_its_last_page_is_saved(nodes, model_dir, file_url):
    """A page that becomes full in a request's last step is saved after it finished: vLLM
    keeps the blocks (request_finished returned True) until the worker copied the page."""
    node = nodes(model_dir, file_url)
    node.add("a", _prompt(5, 60), max_tokens=5)  # 60 + 4 fed outputs = 64 tokens = 4 pages
    held = False
    for _ in range(20):
        node.step()
        node.wait_io()
        if "a" in node.scheduler.requests and node.scheduler.requests["a"].is_finished():
            held = True
        if not node.scheduler.requests:
            break
    assert held, "the finished request's blocks were not held for its save"
    assert node.workers[0].worker.stats["saved_pages"] == 4
    node.assert_no_leak()
    node2 = nodes(model_dir, file_url)
    node2.add("b", node2_prompt := _prompt(5, 60) + [3] * 8)
    assert node2_prompt[:60] == _prompt(5, 60)
    assert _first_run(node2, "b")[0] == 3 * BLOCK  # the output tokens differ: 3 prompt pages
    node2.run()
