"""Soak: several request threads through ONE cache + linker over a real Redis store with light
fault injection, for a bounded time (RADIXLINK_SOAK_S: 10 s by default, 120 s in `make soak`).
Reports requests served, tokens by source, loads and failures; checks that every served prefix
held exactly the model's K/V and that accounting is exact at the end.

The cache is not thread-safe: request threads serialize every cache/linker call with one lock
(as an engine's scheduler thread would); store I/O runs on the linker's worker threads.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from typing import Any

import pytest
import torch
from faults.kit import MODEL_NS, PS, assert_exact, kv_matches, make_cache, write_kv

from radixlink.contract import InsertParams
from radixlink.linker.core import ExternalCacheLinker
from radixlink.stores import open_store
from radixlink.stores.faults import FaultyStore

pytestmark = [pytest.mark.slow, pytest.mark.redis]

DURATION_S = float(os.environ.get("RADIXLINK_SOAK_S", "10"))  # make soak: 120 s
NUM_THREADS = 4
NUM_DOCS, DOC_PAGES = 24, 12  # a working set of 288 pages over a 128-page cache


class Engine:
    """One cache + linker shared by request threads under one condition lock."""

    def __init__(self, linker: ExternalCacheLinker):
        self.linker, self.cache = linker, linker.cache
        self.cond = threading.Condition()
        self.outcomes: dict[Any, Any] = {}
        self.counts: Counter[str] = Counter()
        self.errors: list[BaseException] = []

    def wait(self, rid: Any) -> Any:
        """Poll under the lock, hand every outcome to its thread, return ours."""
        with self.cond:
            while rid not in self.outcomes:
                for out in self.linker.poll():
                    self.outcomes[out.req_id] = out
                if rid not in self.outcomes:
                    self.cond.wait(0.005)
            self.cond.notify_all()
            return self.outcomes.pop(rid)

    def serve(self, tokens: list[int], rid: Any) -> None:
        """match (+ LOOKUP) -> load or lock -> check served K/V -> compute -> insert -> unlock."""
        counts = self.counts
        with self.cond:
            m = self.cache.match_prefix(tokens, req_id=rid)
            started = bool(m.external_hit_len) and self.linker.load(rid)
            if not started:
                prefix, slots, handle = m.prefix_len, m.device_indices, self.cache.lock(m.last_node)
        if started:
            out = self.wait(rid)
            counts["loads_ok" if out.ok else "loads_failed"] += 1
            counts["tokens_from_store"] += out.prefix_len - m.prefix_len if out.ok else 0
            prefix, slots, handle = out.prefix_len, out.device_indices, out.lock
        time.sleep(0.0005)  # the model runs; other threads take the lock meanwhile
        with self.cond:
            assert kv_matches(self.cache, slots, tokens[:prefix], 0), f"{rid}: wrong K/V served"
            new = self.cache.alloc(len(tokens) - prefix)
            if new is None:
                self.cache.unlock(handle)
                counts["no_room"] += 1
                return
            kv = torch.cat([slots, new])
            write_kv(self.cache, kv[prefix : len(tokens)], tokens, prefix)
            n = len(tokens) // PS * PS
            self.cache.insert(InsertParams(key=tokens, value=kv[:n], prev_prefix_len=prefix))
            if kv.shape[0] > n:
                self.cache.free(kv[n:])
            self.cache.unlock(handle)
        counts["served"] += 1
        counts["tokens_from_device"] += m.prefix_len
        counts["tokens_computed"] += len(tokens) - prefix

    def run(self, thread_id: int, stop_at: float) -> None:
        rng = random.Random(1000 + thread_id)
        n = 0
        try:
            while time.monotonic() < stop_at:
                doc = min(int(rng.paretovariate(1.2)) - 1, NUM_DOCS - 1)
                pages = rng.randint(1, DOC_PAGES)
                tokens = [1000 * (doc + 1) + i for i in range(pages * PS)]
                tokens += [rng.randrange(500_000, 600_000) for _ in range(rng.randint(1, 9))]
                n += 1
                self.serve(tokens, (thread_id, n))
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test thread
            self.errors.append(exc)


def test_soak_threads_through_one_cache_linker_and_redis(redis_url: str, redis_server) -> None:
    """Four request threads for DURATION_S over one cache (128 pages), one linker and a real
    Redis store (4 MB, allkeys-lru: it evicts too) failing 1% of calls and corrupting 1% of
    pages: no thread sees an error or wrong K/V, loads and failures both happen, every load
    has an outcome, and at the end the tree is verified and no slot or lock is held."""
    redis_server.cli("config", "set", "maxmemory", "4mb")
    redis_server.cli("config", "set", "maxmemory-policy", "allkeys-lru")
    store = FaultyStore(open_store(redis_url), fail=0.01, corrupt=0.01, seed=7)
    cache = make_cache(num_tokens=128 * PS, namespace=MODEL_NS)
    engine = Engine(ExternalCacheLinker(cache, store, load_timeout_s=5.0))
    stop_at = time.monotonic() + DURATION_S
    threads = [threading.Thread(target=engine.run, args=(i, stop_at)) for i in range(NUM_THREADS)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=DURATION_S + 120)
    assert not any(t.is_alive() for t in threads), "a request thread hung"
    if engine.errors:
        raise engine.errors[0]
    with engine.cond:
        assert engine.linker.flush(timeout=30)
        stats = engine.linker.stats()
        engine.linker.close()
    elapsed = time.monotonic() - started
    counts = engine.counts
    evicted = store.inner.nodes()[0].info("stats")["evicted_keys"]
    report = {**counts, "seconds": round(elapsed, 1), "redis_evicted_pages": evicted,
              "linker": stats, "faults": store.stats()}
    print(f"\nsoak: {report}")
    assert counts["served"] >= 200 and counts["loads_ok"] > 0 and counts["tokens_from_store"] > 0
    assert counts["loads_failed"] > 0 and stats["failures_load"] > 0
    assert counts["loads_ok"] + counts["loads_failed"] == stats["loads_started"] + stats.get(
        "shared_loads", 0)
    assert stats["loads_in_flight"] == 0 and stats["pending_transfers"] == 0
    assert engine.outcomes == {}
    assert_exact(cache)
