"""A damaged store healed in one pass (every bad page of a load named, deleted and overwritten
by its recomputed page), and concurrent loads of shared pages fetched once per step."""

from __future__ import annotations

import logging

import pytest

from .conftest import VLLM_MISSING  # noqa: E402, I001

pytest.importorskip("vllm", reason=VLLM_MISSING)

from radixlink.stores import open_store  # noqa: E402

from .harness import BLOCK  # noqa: E402
from .test_failures import _flip_payload_byte  # noqa: E402
from .test_round_trip import _first_run, _prompt  # noqa: E402

WORKER_LOG = "radixlink.integrations.vllm.worker_side"


def _damage(url: str, keys: list[str], deleted: int) -> None:
    """Page 2 flipped, page 4 truncated, pages 7 and 8 swapped, page ``deleted`` deleted."""
    _flip_payload_byte(url, keys[2])
    with open_store(url) as store:
        v4, v7, v8 = store.get([keys[4], keys[7], keys[8]])
        assert store.put({keys[4]: v4[: len(v4) // 2], keys[7]: v8, keys[8]: v7}) == [True] * 3
        assert store.delete([keys[deleted]]) == 1


@pytest.mark.parametrize(("hybrid", "deleted", "reasons"), [
    (False, 10, ("checksum=1", "key=2", "truncated=1")),  # the load reads every bad page
    (True, 6, ("checksum=1", "truncated=1")),  # the lookup stops at page 6: 7, 8 are unread
], ids=["one_group-deleted_last", "hybrid-deleted_between"])  # fmt: skip
def test_a_store_damaged_in_five_places_heals_in_one_pass(nodes, model_dir, file_url, hybrid,
                                                          deleted, reasons, caplog):
    """Flow: node 1 stores a 200-token prompt (12 pages); five full-attention pages are
    damaged (one flipped, one truncated, two swapped, one deleted); node 2's load fails once,
    with one warning naming the reasons of the bad pages it read, deletes those, and its
    recompute saves every page again (past a failed load nothing is skipped as present: pages
    after the deleted one were never read); a fresh node 3 then loads all 12 pages."""
    prompt = _prompt(50, 200)
    node1 = nodes(model_dir, file_url, hybrid=hybrid)
    node1.add("a", prompt)
    node1.run()
    node2 = nodes(model_dir, file_url, hybrid=hybrid)
    req = node2.add("b", prompt)
    _damage(file_url, node2.connector.scheduler_side.page_keys(req, 12)[:12], deleted)
    with caplog.at_level(logging.WARNING, logger=WORKER_LOG):
        # a lookup stops at the deleted page; one group keeps the 2 pages before page 2, and
        # vLLM recomputes a failed hybrid request whole
        start = 0 if hybrid else 2 * BLOCK
        assert _first_run(node2, "b") == (start, 200 - start)
        node2.run()
    warnings = [r.getMessage() for r in caplog.records if r.name == WORKER_LOG]
    assert len(warnings) == 1, warnings
    for reason in ("request b failed", *reasons):
        assert reason in warnings[0], warnings[0]
    stats = node2.workers[0].worker.stats
    bad = len(reasons) + (1 if deleted == 10 else 0)  # key=2: two pages
    assert (stats["failed_loads"], stats["bad_pages"], stats["healed_pages"]) == (1, bad, bad)
    node2.assert_no_leak()
    node3 = nodes(model_dir, file_url, hybrid=hybrid)
    node3.add("c", prompt)
    assert _first_run(node3, "c") == (192, 8)
    node3.run()
    assert node3.workers[0].worker.stats["failed_loads"] == 0
    # 12 full-attention pages, plus the 3 window pages of the sliding-window group
    assert node3.workers[0].worker.stats["loaded_pages"] == 12 + (3 if hybrid else 0)


def test_concurrent_loads_of_a_shared_prefix_fetch_each_page_once(nodes, model_dir, file_url):
    """Six requests admitted in one step share a 6-page prefix and have 2 pages of their own
    each (8 loaded pages per request): the step's loads read 6 + 6 * 2 = 18 distinct pages
    from the store, not 6 * 8 = 48, and every request's blocks get the shared pages (the
    stand-in forward checks each request's KV)."""
    shared = _prompt(60, 96)
    prompts = [shared + _prompt(61 + i, 40) for i in range(6)]  # 136 tokens: 8 pages + 8
    node1 = nodes(model_dir, file_url)
    for i, p in enumerate(prompts):
        node1.add(f"a{i}", p)
    node1.run()
    node2 = nodes(model_dir, file_url)
    for i, p in enumerate(prompts):
        node2.add(f"b{i}", p)
    out = node2.step()
    assert out.num_scheduled_tokens == {}  # all six loads started in this one step
    node2.wait_io()
    worker = node2.workers[0].worker
    assert worker.stats["fetched_pages"] == 18
    assert worker.store_stats()["hits"] == 18  # the store's own count of pages read
    node2.run()
    assert worker.stats["loaded_pages"] == 48
    assert node2.checked_tokens >= 6 * 128
    assert node2.connector_stats["fetched_pages"] == 18  # as vLLM's stat loggers got it
    assert node2.connector_stats["loaded_pages"] == 48
    node2.assert_no_leak()


def test_damage_behind_a_missing_page_is_overwritten_by_the_recompute(nodes, model_dir,
                                                                      file_url):
    """Page 1 deleted, pages 2, 4, 7, 8 damaged behind it: the lookup stops at page 1, so no
    load fails and the damaged pages are never read; the lookup saw stored pages past the
    missing one, so the request's recomputed pages overwrite them all, and a fresh node then
    loads all 12 pages."""
    prompt = _prompt(50, 200)
    node1 = nodes(model_dir, file_url)
    node1.add("a", prompt)
    node1.run()
    node2 = nodes(model_dir, file_url)
    req = node2.add("b", prompt)
    _damage(file_url, node2.connector.scheduler_side.page_keys(req, 12)[:12], 1)
    assert _first_run(node2, "b") == (BLOCK, 200 - BLOCK)
    node2.run()
    assert node2.workers[0].worker.stats["failed_loads"] == 0
    node2.assert_no_leak()
    node3 = nodes(model_dir, file_url)
    node3.add("c", prompt)
    assert _first_run(node3, "c") == (192, 8)
    node3.run()
    assert node3.workers[0].worker.stats["failed_loads"] == 0
    assert node3.workers[0].worker.stats["loaded_pages"] == 12
