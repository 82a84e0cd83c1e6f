"""Fault matrix, Redis: the server SIGKILLed while a load's batch get is in flight and then
restarted, and a server that is unreachable when the linker starts and comes up later."""

from __future__ import annotations

import time

import pytest
from redis_server import RedisServer, free_port

from radixlink.stores import open_store
from radixlink.stores.faults import FaultyStore

from .kit import MODEL_NS, TOKENS, assert_exact, make_cache, offload, request

pytestmark = pytest.mark.redis
OTHER = list(range(300, 340))


def test_server_killed_during_a_load_then_restarted(redis_url, redis_server, link) -> None:
    """Flow: B's load is inside its batch get when the server is SIGKILLed -> the load fails
    (StoreError), B recomputes; while the server is down lookups are misses and offloads fail,
    all counted, nothing raises. The server restarts empty on the same port -> the same store
    objects reconnect: A's stale stored mark is revalidated, its pages offloaded again, and a
    fresh cache C loads them byte-identical."""
    cache_a = make_cache(namespace=MODEL_NS)
    linker_a = link(cache_a, open_store(redis_url), revalidate_after_s=0.0)
    offload(cache_a, linker_a)
    cache_b = make_cache(namespace=MODEL_NS)
    linker_b = link(cache_b, FaultyStore(open_store(redis_url), delay_ms=800, ops=("get",)))
    assert cache_b.match_prefix(TOKENS, req_id="b1").external_hit_len == 40
    assert linker_b.load("b1")
    time.sleep(0.1)  # the worker is inside get() now
    redis_server.kill()
    out = linker_b.wait_load("b1", timeout=30)
    assert not out.ok and "StoreError" in out.reason and out.prefix_len == 0, out.reason
    cache_b.unlock(out.lock)
    down = request(cache_b, linker_b, OTHER, "b2")
    assert down["hit"] == 0 and down["prefix"] == 0
    assert linker_b.flush(timeout=30)
    stats = linker_b.stats()
    assert stats["failures_load"] == 1 and stats["failures_lookup"] == 1
    assert stats["failures_offload"] >= 1
    assert_exact(cache_b)

    redis_server.start()
    assert request(cache_a, linker_a, TOKENS, "a2")["prefix"] == 40
    assert linker_a.flush(timeout=30)
    assert linker_a.stats()["lost_nodes"] >= 1
    cache_c = make_cache(namespace=MODEL_NS)
    result = request(cache_c, link(cache_c, open_store(redis_url)), TOKENS, "c1")
    assert result["ok"] and result["prefix"] == 40, result
    assert_exact(cache_a)
    assert_exact(cache_c)


def test_server_unreachable_at_start_then_up(tmp_path, link) -> None:
    """The linker opens a Redis URL with nothing listening: requests are served from device
    (lookup misses, offloads fail, all counted, nothing raises). Once a server listens on that
    port, the next hit re-offloads and another cache loads the pages."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    cache_a = make_cache(namespace=MODEL_NS)
    linker_a = link(cache_a, url)  # a URL: the linker owns (and closes) the store
    started = time.monotonic()
    first = request(cache_a, linker_a, TOKENS, "a1")
    assert linker_a.flush(timeout=30) and time.monotonic() - started < 5
    assert first["hit"] == 0 and first["prefix"] == 0
    stats = linker_a.stats()
    assert stats["failures_lookup"] == 1 and stats["failures_offload"] == 1, stats
    assert_exact(cache_a)

    port = int(url.rsplit(":", 1)[1].split("/")[0])
    server = RedisServer(tmp_path, port=port).start()
    try:
        assert request(cache_a, linker_a, TOKENS, "a2")["prefix"] == 40
        assert linker_a.flush(timeout=30)
        assert cache_a.match_prefix(TOKENS).last_node.external_cache_stored
        cache_b = make_cache(namespace=MODEL_NS)
        result = request(cache_b, link(cache_b, url), TOKENS, "b1")
        assert result["ok"] and result["prefix"] == 40, result
        assert_exact(cache_a)
        assert_exact(cache_b)
    finally:
        server.stop()
