"""Hypothesis state machine over UnifiedCache + ExternalCacheLinker + a fault-injecting store.

Rules mix requests (match, LOOKUP, load, compute, insert), loads left in flight and polled
later, a healthy peer cache writing to the same store, flushes, evictions, locks, the store
losing pages, and fault knobs toggled at random (errors, corruption, truncation, latency past
the load timeout, a full disk). Sequences share and diverge from common page prefixes, so
inserts and loads split nodes. After every step: the tree's and every pool's invariants, and
every cached page holds exactly the K/V the model wrote (nothing unverified was published).
Whenever nothing is in flight, no slot is held outside the tree.
"""

from __future__ import annotations

import hypothesis.strategies as st
import torch
from faults.kit import PS, assert_exact, kv_matches, make_cache, serve, verify_tree, write_kv
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from radixlink.contract import InsertParams
from radixlink.linker.core import ExternalCacheLinker
from radixlink.stores.codec import HEADER_BYTES
from radixlink.stores.faults import FaultyStore
from radixlink.stores.memory import MemoryStore

PAGES = st.lists(st.integers(0, 1), min_size=1, max_size=5)  # page patterns, page by page
TAIL = st.integers(0, PS - 1)  # a partial last page
PAGE_STORED = HEADER_BYTES + 2 * 2 * 2 * 8 * 4 * PS  # codec header + one page of the layout


def tokens_of(pages: list[int], tail: int) -> list[int]:
    return [10 + 10 * choice + i for choice in pages for i in range(PS)] + [7] * tail


class LinkerMachine(RuleBasedStateMachine):
    """request / start_load / poll / wait / peer / flush / evict / lock / faults / store loss."""

    @initialize(
        num_pages=st.integers(5, 14),
        policy=st.sampled_from(["write_through", "write_through_selective", "write_back"]),
        store_pages=st.integers(12, 64),
        seed=st.integers(0, 2**16),
    )
    def setup(self, num_pages: int, policy: str, store_pages: int, seed: int) -> None:
        self.inner = MemoryStore(capacity_bytes=store_pages * PAGE_STORED)
        self.faulty = FaultyStore(self.inner, seed=seed)
        self.peer = make_cache(num_tokens=256)
        self.peer_linker = ExternalCacheLinker(self.peer, self.inner)
        for pattern in range(8):  # the store starts with every 3-page sequence (14 pages)
            serve(self.peer, tokens_of([pattern >> 2 & 1, pattern >> 1 & 1, pattern & 1], 0))
        self.peer_linker.flush(timeout=10)
        self.cache = make_cache(num_tokens=num_pages * PS)
        self.linker = ExternalCacheLinker(self.cache, self.faulty, write_policy=policy,
                                          load_timeout_s=0.05, num_threads=2)
        self.pending: dict[str, list[int]] = {}
        self.locks: list = []
        self.next_id = 0

    def teardown(self) -> None:
        if not hasattr(self, "linker"):
            return
        for rid in list(self.pending):
            self._finish(self.linker.wait_load(rid, timeout=10))
        for handle in self.locks:
            self.cache.unlock(handle)
        self.linker.close()
        self.peer_linker.close()
        stats = self.linker.stats()
        for name in ("loads_started", "failures_load", "failures_timeout", "shared_loads",
                     "failures_offload", "offloaded_pages"):
            event(f"{name}: {'0' if not stats.get(name) else '1-4' if stats[name] < 5 else '5+'}")
        assert_exact(self.cache)
        assert_exact(self.peer)

    # ---------------------------------------------------------------- helpers

    def _rid(self) -> str:
        self.next_id += 1
        return f"r{self.next_id}"

    def _finish(self, out) -> None:
        """Check a load outcome: what it hands out is exactly the model's K/V; then unlock."""
        tokens = self.pending.pop(out.req_id)
        assert out.prefix_len % PS == 0 and out.device_indices.numel() == out.prefix_len
        assert kv_matches(self.cache, out.device_indices, tokens[: out.prefix_len], 0)
        event(f"load {'ok' if out.ok else 'failed: ' + out.reason.split(':')[0]}")
        self.cache.unlock(out.lock)

    def _compute(self, tokens: list[int], prefix: int, slots: torch.Tensor, handle) -> None:
        """The model computes tokens[prefix:], inserts and unlocks (or gives up: no room)."""
        assert kv_matches(self.cache, slots, tokens[:prefix], 0), "served wrong K/V"
        new = self.cache.alloc(len(tokens) - prefix)
        if new is None:
            event("no room")
            self.cache.unlock(handle)
            return
        kv = torch.cat([slots, new])
        write_kv(self.cache, kv[prefix : len(tokens)], tokens, prefix)
        n = len(tokens) // PS * PS
        self.cache.insert(InsertParams(key=tokens, value=kv[:n], prev_prefix_len=prefix))
        if kv.shape[0] > n:
            self.cache.free(kv[n:])
        self.cache.unlock(handle)

    # ---------------------------------------------------------------- rules

    @rule(pages=PAGES, tail=TAIL)
    def request(self, pages: list[int], tail: int) -> None:
        """One whole request: match + LOOKUP, load (waited for) if the store has more."""
        tokens, rid = tokens_of(pages, tail), self._rid()
        m = self.cache.match_prefix(tokens, req_id=rid)
        if m.external_hit_len and self.linker.load(rid):
            out = self.linker.wait_load(rid)
            event(f"request load {'ok' if out.ok else 'failed'}")
            self._compute(tokens, out.prefix_len, out.device_indices, out.lock)
        else:
            self._compute(tokens, m.prefix_len, m.device_indices, self.cache.lock(m.last_node))

    @rule(pages=PAGES)
    def start_load(self, pages: list[int]) -> None:
        """A load left in flight, collected later by poll or wait."""
        tokens, rid = tokens_of(pages, 0), self._rid()
        if self.cache.match_prefix(tokens, req_id=rid).external_hit_len and self.linker.load(rid):
            self.pending[rid] = tokens

    @rule(pages=PAGES, num=st.integers(2, 4))
    def burst(self, pages: list[int], num: int) -> None:
        """Several requests for one prefix at once: they share one transfer."""
        for _ in range(num):
            self.start_load(pages)

    @rule(pages=PAGES)
    def slow_load(self, pages: list[int]) -> None:
        """A load whose get outlasts the timeout: it fails now; its slots are freed later."""
        delay, self.faulty.delay_ms = self.faulty.delay_ms, 80.0
        self.start_load(pages)
        self.faulty.delay_ms = delay
        rid = f"r{self.next_id}"
        if rid in self.pending:
            self._finish(self.linker.wait_load(rid))

    @rule()
    def poll(self) -> None:
        for out in self.linker.poll():
            self._finish(out)

    # NOTE: no preconditions on state that depends on thread timing (what is in flight): the
    # rules draw an index and are no-ops when there is nothing, so generation is repeatable.
    @rule(index=st.integers(0, 7))
    def wait_one(self, index: int) -> None:
        if self.pending:
            rid = sorted(self.pending)[index % len(self.pending)]
            self._finish(self.linker.wait_load(rid, timeout=10))

    @rule(pages=PAGES)
    def peer_serves(self, pages: list[int]) -> None:
        """A healthy peer computes a sequence and writes it to the shared store."""
        serve(self.peer, tokens_of(pages, 0))
        self.peer.check_invariants()
        verify_tree(self.peer)

    @rule()
    def flush(self) -> None:
        self.linker.flush(timeout=10)
        self.peer_linker.flush(timeout=10)

    @rule(num_tokens=st.integers(1, 40))
    def evict(self, num_tokens: int) -> None:
        self.cache.evict(num_tokens)

    @rule(pages=PAGES)
    def lock(self, pages: list[int]) -> None:
        self.locks.append(self.cache.lock(self.cache.match_prefix(tokens_of(pages, 0)).last_node))

    @rule(index=st.integers(0, 7))
    def unlock(self, index: int) -> None:
        if self.locks:
            self.cache.unlock(self.locks.pop(index % len(self.locks)))

    @rule(
        fail=st.sampled_from([0.0, 0.0, 0.3, 1.0]),
        corrupt=st.sampled_from([0.0, 0.0, 0.2, 1.0]),
        truncate=st.sampled_from([0.0, 0.0, 0.2]),
        enospc=st.sampled_from([0.0, 0.0, 0.5, 1.0]),
    )
    def set_faults(self, fail: float, corrupt: float, truncate: float, enospc: float) -> None:
        """Toggle the store's fault knobs."""
        faulty = self.faulty
        faulty.fail, faulty.corrupt, faulty.truncate = fail, corrupt, truncate
        faulty.enospc = enospc

    @rule(delay_ms=st.sampled_from([0.0, 5.0, 80.0]))
    def set_latency(self, delay_ms: float) -> None:
        """Store latency; 80 ms is past the 50 ms load timeout."""
        self.faulty.delay_ms = delay_ms

    @rule(every=st.integers(1, 3))
    def store_loses_pages(self, every: int) -> None:
        keys = [key for i, (key, _) in enumerate(self.inner.scan()) if i % every == 0]
        self.inner.delete(keys)

    # ---------------------------------------------------------------- invariants

    @invariant()
    def cache_is_consistent_and_verified(self) -> None:
        self.cache.check_invariants()
        verify_tree(self.cache)

    @invariant()
    def nothing_held_when_nothing_is_in_flight(self) -> None:
        stats = self.linker.stats()
        if not self.pending and stats["loads_in_flight"] == 0:
            assert self.cache.stats()["held_tokens"] == 0, (stats, self.cache.stats())
        assert self.peer.stats()["held_tokens"] == 0


LinkerMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    derandomize=True,
)
test_linker_machine = LinkerMachine.TestCase
