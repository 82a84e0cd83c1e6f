"""``close()`` with a hung store respects one overall budget (issue #24, item 6). Flow: a
linker over a real redis-server; the server is paused by SIGSTOP; 30 requests each queue an
offload job (30 jobs behind two transfer threads, every store call hanging until its socket
timeout); close() returns within its budget plus one store timeout, cancels the queued jobs,
holds no lock and marks nothing stored."""

from __future__ import annotations

import os
import signal
import time

import pytest
from redis_server import RedisServer

from radixlink.linker.core import ExternalCacheLinker

from .kit import MODEL_NS, assert_exact, make_cache, serve

pytestmark = pytest.mark.redis
NUM_JOBS = 30


def test_close_with_a_paused_redis_and_30_queued_offloads_is_bounded(
        server: RedisServer) -> None:
    """30 offload jobs queued on a paused Redis: close() takes well under 5 s (it took about
    1 s per job before), leaves no lock, and no node is marked stored."""
    cache = make_cache(num_tokens=4096, namespace=MODEL_NS)
    linker = ExternalCacheLinker(cache, server.url)
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    for i in range(NUM_JOBS):
        serve(cache, [1000 * i + t for t in range(16)])
        linker.poll()  # NOTE: sends this request's offload as its own job
    assert linker.stats()["offload_batches"] == NUM_JOBS
    start = time.monotonic()
    linker.close()
    took = time.monotonic() - start
    os.kill(server.proc.pid, signal.SIGCONT)
    print(f"close() took {took:.2f} s")
    assert took < 5.0, f"close() took {took:.1f} s with {NUM_JOBS} queued jobs"
    assert_exact(cache)
    for root in cache.tree.roots():
        for node in root.children.values():
            assert not node.external_cache_stored and not node.offload_inflight
