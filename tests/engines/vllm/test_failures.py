"""Load failures under vLLM's ``recompute`` policy: a corrupt page, a store that dies mid-load
and a dead store all end with every token's KV equal to what the storing node computed."""

from __future__ import annotations

import pytest

from .conftest import VLLM_MISSING  # noqa: E402, I001

pytest.importorskip("vllm", reason=VLLM_MISSING)

from radixlink.stores import open_store  # noqa: E402

from .conftest import faults_url  # noqa: E402
from .harness import Node  # noqa: E402
from .test_round_trip import _first_run, _prompt  # noqa: E402


def _store_one(nodes, model_dir, url, prompt) -> Node:
    node = nodes(model_dir, url)
    node.add("a", prompt)
    node.run()
    return node


def _flip_payload_byte(url: str, key: str) -> None:
    with open_store(url) as store:
        blob = bytearray(store.get([key])[0])
        blob[-1] ^= 0xFF
        assert store.put({key: bytes(blob)}) == [True]


def _page_keys(url: str) -> list[str]:
    with open_store(url) as store:
        return sorted(key for key, _ in store.scan(""))


@pytest.mark.parametrize("kind", ["file", "redis"])
def test_corrupt_page_is_a_load_error_then_recomputed_and_healed(nodes, model_dir, file_url,
                                                                 kind, request):
    """One flipped byte in a stored page: node 2 keeps the verified pages before it, vLLM
    recomputes from that page, and the page is replaced in the store by a good one."""
    url = file_url if kind == "file" else request.getfixturevalue("redis_url")
    prompt = _prompt(30, 100)
    _store_one(nodes, model_dir, url, prompt)
    node2 = nodes(model_dir, url)
    req = node2.add("b", prompt)
    hashes = [bytes(h).hex() for h in req.block_hashes]
    bad = next(k for k in _page_keys(url) if hashes[3] in k)
    _flip_payload_byte(url, bad)
    assert _first_run(node2, "b") == (48, 52)  # pages 0..2 loaded, 3.. recomputed
    node2.run()
    assert node2.workers[0].worker.stats["failed_loads"] == 1
    node2.assert_no_leak()
    node3 = nodes(model_dir, url)  # the healed page loads
    node3.add("c", prompt)
    assert _first_run(node3, "c") == (96, 4)
    node3.run()


def test_every_page_corrupted_by_the_store_is_recomputed(nodes, model_dir, file_url):
    """faults:// corrupting every page read: nothing is loaded, all 100 tokens are computed."""
    prompt = _prompt(31, 100)
    _store_one(nodes, model_dir, file_url, prompt)
    node2 = nodes(model_dir, faults_url(file_url, corrupt=1, ops="get"))
    node2.add("b", prompt)
    assert _first_run(node2, "b") == (0, 100)
    node2.run()
    assert node2.workers[0].worker.stats["loaded_pages"] == 0
    node2.assert_no_leak()


def test_store_dying_mid_load_recomputes(nodes, model_dir, file_url):
    """Lookup finds the pages, then every get fails (faults://, ops=get, fail=1): the whole
    load is a load error and vLLM recomputes the prompt."""
    prompt = _prompt(32, 100)
    _store_one(nodes, model_dir, file_url, prompt)
    node2 = nodes(model_dir, faults_url(file_url, fail=1, ops="get"))
    node2.add("b", prompt)
    out = node2.step()
    assert out.num_scheduled_tokens == {}  # the async load was started
    node2.wait_io()
    assert _first_run(node2, "b") == (0, 100)
    node2.run()
    node2.assert_no_leak()


def test_dead_redis_is_a_miss_not_an_error(nodes, model_dir, redis_server):
    """A Redis that was killed before the lookup: no hit, no crash, correct KV."""
    url = redis_server.url
    node1 = _store_one(nodes, model_dir, url, _prompt(33, 100))
    node2 = nodes(model_dir, url)
    redis_server.kill()
    try:
        node2.add("b", _prompt(33, 100))
        assert _first_run(node2, "b") == (0, 100)
        node2.run()
        node2.assert_no_leak()
    finally:
        redis_server.start()
    assert node1.scheduler.get_kv_connector().scheduler_side.num_store_errors == 0
    assert node2.connector.scheduler_side.num_store_errors >= 1


def test_a_bug_splitting_a_loads_verdict_fails_the_loads_not_the_step(nodes, model_dir,
                                                                      file_url, monkeypatch):
    """The per-request split of a LOAD job's verdict runs on an I/O thread; if it raises (a
    bug), the step's loads fail and vLLM recomputes them: the request is not left waiting
    for a load that never ends."""
    from radixlink.integrations.vllm.loads import LoadPlan

    prompt = _prompt(33, 100)
    _store_one(nodes, model_dir, file_url, prompt)
    node2 = nodes(model_dir, file_url)

    def broken(self, job, done):
        raise RuntimeError("split bug")

    monkeypatch.setattr(LoadPlan, "split", broken)
    node2.add("b", prompt)
    node2.step()
    node2.wait_io()
    assert _first_run(node2, "b") == (0, 100)  # the load failed: all 100 tokens computed
    node2.run()
    assert node2.workers[0].worker.stats["failed_loads"] == 1
    node2.assert_no_leak()


def test_a_save_that_cannot_stage_is_dropped_not_raised_into_the_worker(nodes, model_dir,
                                                                        file_url, monkeypatch):
    """Staging a save fails (here: ``stage_pages`` raises): the save is dropped with its
    buffers and budget given back, the request still finishes, nothing raises into vLLM."""
    from radixlink.integrations.vllm import worker_side

    def broken(*args, **kwargs):
        raise RuntimeError("staging bug")

    monkeypatch.setattr(worker_side.pageio, "stage_pages", broken)
    node = nodes(model_dir, file_url)
    node.add("a", _prompt(34, 100))
    node.run()
    node.wait_io()
    assert node.workers[0].worker._inflight_bytes == 0
    node.assert_no_leak()
    assert _page_keys(file_url) == []  # nothing was written


@pytest.mark.parametrize("broken_at", ["scatter", "payload_views"])
def test_a_scatter_that_raises_fails_the_load_not_the_worker(nodes, model_dir, file_url,
                                                             monkeypatch, broken_at):
    """Landing verified pages in vLLM's blocks raises (a bug, a device error): copying them
    from staging (``scatter``; the direct read turned off), or finding the blocks a direct
    read goes into (``payload_views``): the load fails and vLLM recomputes the request;
    nothing raises out of get_finished."""
    from radixlink.integrations.vllm.pages import PagedGroup
    from radixlink.integrations.vllm.worker_side import ChunkLanding

    prompt = _prompt(35, 100)
    _store_one(nodes, model_dir, file_url, prompt)
    node2 = nodes(model_dir, file_url)

    def broken(self, *args, **kwargs):
        raise RuntimeError("scatter bug")

    monkeypatch.setattr(PagedGroup, broken_at, broken)
    if broken_at == "scatter":
        monkeypatch.setattr(ChunkLanding, "targets", lambda self, span: None)
    node2.add("b", prompt)
    assert _first_run(node2, "b") == (0, 100)  # the load failed: all 100 tokens computed
    node2.run()
    assert node2.workers[0].worker.stats["failed_loads"] == 1
    assert node2.workers[0].worker.stats["loaded_pages"] == 0
    node2.assert_no_leak()
