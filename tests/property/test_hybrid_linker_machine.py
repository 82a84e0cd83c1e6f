"""Hypothesis state machine over hybrid caches (FULL+SWA, FULL+MAMBA, FULL+SWA+MAMBA) with tight
window and state pools, an ``ExternalCacheLinker`` and a fault-injecting store shared with a
healthy peer cache.

Rules interleave requests (match + LOOKUP + load + compute + insert) over sequences that share
and diverge from common page prefixes, loads left in flight (polled, waited for, timed out,
cancelled), reads of a match, evictions of each pool, locks, the store losing pages and fault
knobs. After every step:
  (a) every page the tree holds (full K/V, the live SWA window, each node's state) is exactly
      what the model wrote for the node's whole path (tests/oracle.py): what the peer held;
  (c) a match changes nothing but recency (same nodes, values, counters);
  (d) a published load serves, under its lock, exactly the model's full K/V, SWA window and
      state of its prefix;
  (e) a published load restores everything its lookup found (device prefix + store hit), and
      with no fault armed and nothing else in flight a load does not fail;
and at the end (b): after close and evicting everything, every pool hands out its whole
capacity (nothing held, nothing leaked).
"""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import oracle
import torch
from hybrid_kit import LAYOUT, PS, STATE, WINDOW
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import EvictParams, InsertParams, PoolName
from radixlink.linker.core import ExternalCacheLinker
from radixlink.stores.faults import FaultyStore
from radixlink.stores.memory import MemoryStore

PAGES = st.lists(st.integers(0, 1), min_size=1, max_size=6)
TAIL = st.integers(0, PS - 1)
KIND = st.sampled_from(["swa", "mamba", "swa+mamba"])


def tokens_of(pages: list[int], tail: int) -> list[int]:
    return [10 + 10 * choice + i for choice in pages for i in range(PS)] + [7] * tail


def make(kind: str, num_pages: int, swa_pages: int, num_states: int) -> UnifiedCache:
    swa, mamba = "swa" in kind, "mamba" in kind
    return UnifiedCache(CacheConfig(
        page_size=PS, num_tokens=num_pages * PS, kv_layout=LAYOUT,
        sliding_window=WINDOW if swa else None, swa_num_tokens=swa_pages * PS if swa else None,
        swa_layout=LAYOUT if swa else None, mamba_num_states=num_states if mamba else None,
        state_layout=STATE if mamba else None, enable_external_cache_linker=True))


# ---------------------------------------------------------------- the deterministic model
# tests/oracle.py: full K/V, SWA K/V and states are functions of the whole prefix, so a page or
# window served for another history with the same tokens at the same positions is caught.


def faults_off(faulty: FaultyStore) -> bool:
    """No fault knob is armed and the store answers well within the load timeout."""
    return not faulty.fail and not faulty.corrupt and faulty.delay_ms <= 5.0


def snapshot(cache: UnifiedCache) -> Any:
    """Everything a match must not change: nodes, their data, counters other than recency."""
    nodes = [(n.node_id, n.seq_len, tuple(None if v is None else
                                          (tuple(v.tolist()) if torch.is_tensor(v) else v)
                                          for v in n.values), tuple(n.lock_refs), n.hit_count)
             for n in cache.tree.iter_nodes()]
    stats = {k: v for k, v in cache.stats().items()
             if k not in ("match_calls", "match_tokens", "hit_tokens")}
    return sorted(nodes), stats


class HybridLinkerMachine(RuleBasedStateMachine):
    """request / start_load / poll / wait / cancel / match / evict / lock / peer / faults."""

    @initialize(kind=KIND, num_pages=st.integers(8, 16), swa_pages=st.integers(3, 8),
                num_states=st.integers(3, 6), seed=st.integers(0, 2**16))
    def setup(self, kind: str, num_pages: int, swa_pages: int, num_states: int,
              seed: int) -> None:
        self.kind = kind
        self.inner = MemoryStore(capacity_bytes=1 << 20)
        self.faulty = FaultyStore(self.inner, seed=seed)
        self.peer = make(kind, 64, 64, 32)
        self.peer_linker = ExternalCacheLinker(self.peer, self.inner)
        for pattern in range(8):
            self._serve(self.peer, tokens_of([pattern >> 2 & 1, pattern >> 1 & 1, pattern & 1],
                                             0))
        self.peer_linker.flush(timeout=10)
        self.cache = make(kind, num_pages, swa_pages, num_states)
        self.linker = ExternalCacheLinker(self.cache, self.faulty, load_timeout_s=0.1)
        self.pending: dict[str, list[int]] = {}
        self.locks: list[Any] = []
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
        oracle.verify_tree(self.cache)
        self.cache.evict(EvictParams(num_tokens=10**6, swa_num_tokens=10**6 if "swa" in
                                     self.kind else 0,
                                     mamba_num=10**6 if "mamba" in self.kind else 0))
        self.cache.check_invariants()
        stats = self.cache.stats()  # (b): every pool hands out its whole capacity again
        assert stats["free_tokens"] == stats["total_tokens"] and stats["num_nodes"] == 0
        assert stats.get("swa_held_tokens", 0) == 0 and stats.get("swa_cached_tokens", 0) == 0
        assert stats.get("mamba_held_states", 0) == 0
        assert stats.get("mamba_cached_states", 0) == 0
        linked = self.linker.stats()
        event(f"kind {self.kind}")
        for name in ("loaded_pages", "stale_lookups", "cancelled_loads", "failures_load",
                     "failures_timeout", "shared_loads", "failures_prepare"):
            event(f"{name}: {'0' if not linked.get(name) else '>0'}")
        event(f"evicted states: {'>0' if stats.get('mamba_evicted_states') else '0'}")

    # ---------------------------------------------------------------- helpers

    def _rid(self) -> str:
        self.next_id += 1
        return f"r{self.next_id}"

    def _serve(self, cache: UnifiedCache, tokens: list[int], prefix: int = 0,
               slots: torch.Tensor | None = None, handle: Any = None, node: Any = None) -> None:
        """Compute ``tokens[prefix:]`` after a cached prefix (``slots`` locked by ``handle``,
        ending at ``node``), insert with the state at the last whole page, unlock."""
        if handle is None:
            m = cache.match_prefix(tokens)
            prefix, slots, node = m.prefix_len, m.device_indices, m.last_node
            handle = cache.lock(node)
        assert slots is not None
        states = cache.pool(PoolName.MAMBA)
        if states is not None and prefix:  # the request's own copy of the state at prefix
            copy = cache.hybrid.copy_state(node)
            if copy is None:
                event("copy refused: every state held or locked")
            else:
                assert torch.equal(states.read_state(copy), oracle.state(cache, tokens[:prefix]))
                cache.hybrid.free_state(copy)
        new = cache.alloc(len(tokens) - prefix)
        if new is None:
            event("no room")
            cache.unlock(handle)
            return
        kv = torch.cat([slots, new])
        oracle.write(cache, kv[prefix : len(tokens)], tokens, prefix)
        n = len(tokens) // PS * PS
        evicted = 0
        if cache.pool(PoolName.SWA) is not None:  # the window moved past these pages
            evicted = max(prefix, (n - WINDOW) // PS * PS - PS)
            if evicted > prefix:
                cache.hybrid.free_swa(kv[prefix:evicted])
        state = cache.hybrid.alloc_state() if states is not None and n > prefix else None
        if state is not None:
            states.write_state(state, oracle.state(cache, tokens[:n]))
        cache.insert(InsertParams(key=tokens, value=kv[:n], prev_prefix_len=prefix,
                                  swa_evicted_seqlen=evicted, mamba_value=state))
        if kv.shape[0] > n:
            cache.free(kv[n:])
        cache.unlock(handle)

    def _finish(self, out: Any) -> None:
        tokens = self.pending.pop(out.req_id)
        assert out.device_indices.numel() == out.prefix_len
        self._check_served(out, tokens)
        event(f"load {'ok' if out.ok else 'failed: ' + out.reason.split(':')[0]}")
        self.cache.unlock(out.lock)

    def _check_served(self, out: Any, tokens: list[int]) -> None:
        """(d): what a published load serves under its lock (full K/V, the SWA window of its
        end, the state there) is exactly the model's for ``tokens[:out.prefix_len]``."""
        if not out.ok:
            return
        assert out.match is not None and out.match.prefix_len == out.prefix_len
        assert oracle.served_matches(self.cache, out.match, tokens), f"{out}: served wrong data"

    # ---------------------------------------------------------------- rules

    @rule(pages=PAGES, tail=TAIL, cold=st.booleans())
    def request(self, pages: list[int], tail: int, cold: bool) -> None:
        """One whole request; ``cold`` evicts first, so that the store has more to give."""
        tokens, rid = tokens_of(pages, tail), self._rid()
        if cold:
            self.cache.evict(len(tokens))
        m = self.cache.match_prefix(tokens, req_id=rid)
        calm = (faults_off(self.faulty) and not self.pending
                and not self.linker.stats()["loads_in_flight"])  # nothing to join or wait on
        if m.external_hit_len and self.linker.load(rid):
            out = self.linker.wait_load(rid)
            event(f"request load {'ok' if out.ok else 'failed'}")
            self._check_served(out, tokens)
            if calm and out.reason != "timeout":  # (e): nothing may fail or come up short
                assert out.ok, f"{rid}: load failed with no fault armed: {out.reason}"
            if out.ok:  # (e): a published load restores all it looked up, its window included
                assert out.prefix_len == m.prefix_len + m.external_hit_len, (
                    f"{rid}: looked up {m.prefix_len} + {m.external_hit_len}, restored "
                    f"{out.prefix_len}")
            self._serve(self.cache, tokens, out.prefix_len, out.device_indices, out.lock,
                        out.last_node)
        else:
            self._serve(self.cache, tokens, m.prefix_len, m.device_indices,
                        self.cache.lock(m.last_node), m.last_node)

    @rule(pages=PAGES, num=st.integers(1, 3), cold=st.booleans())
    def start_load(self, pages: list[int], num: int, cold: bool) -> None:
        """Loads left in flight (``num`` of one prefix share a transfer)."""
        tokens = tokens_of(pages, 0)
        if cold:
            self.cache.evict(len(tokens))
        for _ in range(num):
            rid = self._rid()
            m = self.cache.match_prefix(tokens, req_id=rid)
            if m.external_hit_len and self.linker.load(rid):
                self.pending[rid] = tokens

    @rule(pages=PAGES, full=st.integers(0, 8), swa=st.integers(0, 8), mamba=st.integers(0, 2))
    def evict_between_match_and_load(self, pages: list[int], full: int, swa: int,
                                     mamba: int) -> None:
        """Eviction between match_prefix(req_id) and load(): the load must refuse a device
        prefix that changed (stale lookup) or publish exactly what it then locked."""
        tokens, rid = tokens_of(pages, 0), self._rid()
        if not self.cache.match_prefix(tokens, req_id=rid).external_hit_len:
            return
        self.evict(full * PS, swa * PS, mamba)
        if self.linker.load(rid):
            self.pending[rid] = tokens

    @rule()
    def poll(self) -> None:
        for out in self.linker.poll():
            self._finish(out)

    @rule(index=st.integers(0, 7), timeout=st.sampled_from([None, 0.0, 0.01]))
    def wait_one(self, index: int, timeout: float | None) -> None:
        if self.pending:
            rid = sorted(self.pending)[index % len(self.pending)]
            self._finish(self.linker.wait_load(rid, timeout=timeout))

    @rule(index=st.integers(0, 7))
    def cancel_one(self, index: int) -> None:
        if self.pending:
            rid = sorted(self.pending)[index % len(self.pending)]
            assert self.linker.cancel(rid)
            del self.pending[rid]

    @rule(pages=PAGES, tail=TAIL)
    def match(self, pages: list[int], tail: int) -> None:
        """(c): a match changes nothing but recency."""
        before = snapshot(self.cache)
        m = self.cache.match_prefix(tokens_of(pages, tail))
        assert snapshot(self.cache) == before, "match changed the tree"
        assert m.device_indices.numel() == m.prefix_len

    @rule(pages=PAGES)
    def peer_serves(self, pages: list[int]) -> None:
        self._serve(self.peer, tokens_of(pages, 0))
        self.peer_linker.flush(timeout=10)

    @rule(full=st.integers(0, 16), swa=st.integers(0, 16), mamba=st.integers(0, 3))
    def evict(self, full: int, swa: int, mamba: int) -> None:
        self.cache.evict(EvictParams(num_tokens=full, swa_num_tokens=swa if "swa" in self.kind
                                     else 0, mamba_num=mamba if "mamba" in self.kind else 0))

    @rule(pages=PAGES)
    def lock(self, pages: list[int]) -> None:
        self.locks.append(self.cache.lock(self.cache.match_prefix(tokens_of(pages, 0)).last_node))

    @rule(index=st.integers(0, 7))
    def unlock(self, index: int) -> None:
        if self.locks:
            self.cache.unlock(self.locks.pop(index % len(self.locks)))

    @rule(fail=st.sampled_from([0.0, 0.0, 0.5]), corrupt=st.sampled_from([0.0, 0.0, 0.5]),
          delay_ms=st.sampled_from([0.0, 0.0, 5.0, 150.0]))
    def set_faults(self, fail: float, corrupt: float, delay_ms: float) -> None:
        self.faulty.fail, self.faulty.corrupt, self.faulty.delay_ms = fail, corrupt, delay_ms

    @rule(every=st.integers(1, 4))
    def store_loses_pages(self, every: int) -> None:
        self.inner.delete([k for i, (k, _) in enumerate(self.inner.scan()) if i % every == 0])

    @invariant()
    def consistent_and_verified(self) -> None:
        self.cache.check_invariants()
        oracle.verify_tree(self.cache)


HybridLinkerMachine.TestCase.settings = settings(
    max_examples=120,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    derandomize=True,
)
test_hybrid_linker_machine = HybridLinkerMachine.TestCase
