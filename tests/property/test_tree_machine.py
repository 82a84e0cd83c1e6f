"""Hypothesis state machine over UnifiedCache (FULL): every step keeps the invariants, the
cache agrees with a reference model of cached page prefixes, and adopted ranges agree with a
brute-force oracle.

The model maps each cached page prefix (a tuple of tokens, whole pages) to the slots of its
last page. Inserts update it by the oracle alone; evictions are not predicted (their order is
unit-tested) but must be legal: only unlocked prefixes go, and a prefix goes only with all of
its cached extensions (leaves first).
"""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import torch
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import ComponentType, InsertParams
from radixlink.tree.keys import key_tokens
from radixlink.tree.locks import LockHandle

FULL = ComponentType.FULL
Prefix = tuple[int, ...]

PAGES = st.lists(st.integers(0, 2), max_size=5)  # which page pattern, page by page
TAIL = st.integers(0, 15)  # extra tokens after the whole pages (a partial page)


class TreeMachine(RuleBasedStateMachine):
    """insert / match / lock / unlock / evict / alloc / free against a page-prefix model."""

    @initialize(
        page_size=st.sampled_from([1, 4, 16]),
        num_pages=st.integers(3, 12),
        policy=st.sampled_from(["lru", "lfu"]),
    )
    def setup(self, page_size: int, num_pages: int, policy: str) -> None:
        self.ps = page_size
        self.cache = UnifiedCache(
            CacheConfig(
                page_size=page_size, num_tokens=num_pages * page_size, eviction_policy=policy
            )
        )
        self.model: dict[Prefix, tuple[int, ...]] = {}
        self.locks: list[tuple[LockHandle, Prefix]] = []
        self.released: list[LockHandle] = []
        self.held: list[torch.Tensor] = []

    # ---------------------------------------------------------------- helpers

    def key(self, pages: list[int], tail: int) -> list[int]:
        ps = self.ps
        tokens = [10 * choice + (i % 3) for choice in pages for i in range(ps)]
        return tokens + [9] * (tail % ps)

    def longest(self, key: list[int]) -> int:
        """Oracle: tokens of ``key``'s longest whole-page prefix in the model."""
        best = 0
        for end in range(self.ps, len(key) - len(key) % self.ps + 1, self.ps):
            if tuple(key[:end]) not in self.model:
                break
            best = end
        return best

    def expected_slots(self, key: list[int], length: int) -> list[int]:
        slots: list[int] = []
        for end in range(self.ps, length + 1, self.ps):
            slots.extend(self.model[tuple(key[:end])])
        return slots

    def tree_prefixes(self) -> dict[Prefix, tuple[int, ...]]:
        """Read the cached page prefixes straight from the tree (no recency side effects)."""
        out: dict[Prefix, tuple[int, ...]] = {}
        for node in self.cache.tree.iter_nodes():
            path = self.cache.tree.path_to(node)
            if any(n.values[0] is None for n in path):
                continue
            tokens = [t for n in path for t in key_tokens(n.key).tolist()]
            slots = node.values[0].tolist()
            for i in range(0, node.num_tokens, self.ps):
                end = node.start + i + self.ps
                out[tuple(tokens[:end])] = tuple(slots[i : i + self.ps])
        return out

    def sync_eviction(self) -> None:
        """After anything that may evict: the tree lost only legal prefixes; adopt its view."""
        now = self.tree_prefixes()
        gone = set(self.model) - set(now)
        assert set(now) <= set(self.model), "eviction added prefixes"
        for prefix, slots in now.items():
            assert self.model[prefix] == slots, f"slots of cached prefix {prefix} changed"
        for prefix in gone:
            for other in self.model:
                if other[: len(prefix)] == prefix:
                    assert other in gone, f"{prefix} evicted before its extension {other}"
        if gone:
            event("evicted prefixes")
        for _, locked in self.locks:
            for end in range(self.ps, len(locked) + 1, self.ps):
                assert locked[:end] in now, f"locked prefix {locked[:end]} was evicted"
        self.model = now

    # ---------------------------------------------------------------- rules

    @rule(pages=PAGES, tail=TAIL, chunked=st.booleans())
    def serve(self, pages: list[int], tail: int, chunked: bool) -> None:
        """match -> lock -> alloc (may evict) -> insert(prev = hit) -> free tail -> unlock."""
        key = self.key(pages, tail)
        m = self.cache.match_prefix(key)
        handle = self.cache.lock(m.last_node)
        new = self.cache.alloc(len(key) - m.prefix_len)
        self.locks.append((handle, tuple(key[: m.prefix_len])))
        self.sync_eviction()
        self.locks.pop()
        if new is None:
            event("alloc refused: the rest is locked")
            self.cache.unlock(handle)
            return
        kv = torch.cat([m.device_indices, new])
        self.insert_and_check(key, kv, m.prefix_len, chunked)
        self.cache.unlock(handle)

    @rule(pages=PAGES, tail=TAIL)
    def insert_fresh(self, pages: list[int], tail: int) -> None:
        """Insert with all-fresh slots and prev = 0: cached pages come back as duplicates."""
        key = self.key(pages, tail)
        kv = self.cache.alloc(len(key))
        self.sync_eviction()
        if kv is not None:
            self.insert_and_check(key, kv, 0, False)

    def insert_and_check(self, key: list[int], kv: torch.Tensor, prev: int, chunked: bool) -> None:
        aligned = len(key) // self.ps * self.ps
        cached = self.longest(key)
        assert cached >= prev
        result = self.cache.insert(
            InsertParams(
                key=key,
                value=kv[:aligned],
                prev_prefix_len=prev,
                chunked=chunked,
                track_adopted_ranges=True,
            )
        )
        expected = {FULL: [(cached, aligned)]} if aligned > cached else {}
        assert result.adopted_ranges == expected
        event("insert with duplicates" if cached > prev else "insert without duplicates")
        event("insert adopted pages" if expected else "insert adopted nothing")
        assert result.prefix_len == cached
        for end in range(cached + self.ps, aligned + 1, self.ps):
            self.model[tuple(key[:end])] = tuple(kv[end - self.ps : end].tolist())
        if len(kv) > aligned:
            self.cache.free(kv[aligned:])

    @rule(pages=PAGES, tail=TAIL)
    def match(self, pages: list[int], tail: int) -> None:
        key = self.key(pages, tail)
        m = self.cache.match_prefix(key)
        length = self.longest(key)
        assert m.prefix_len == length
        assert m.device_indices.tolist() == self.expected_slots(key, length)

    @rule(pages=PAGES)
    def lock(self, pages: list[int]) -> None:
        key = self.key(pages, 0)
        m = self.cache.match_prefix(key)
        self.locks.append((self.cache.lock(m.last_node), tuple(key[: m.prefix_len])))

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data: Any) -> None:
        handle, _ = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
        self.cache.unlock(handle)
        self.released.append(handle)

    @precondition(lambda self: self.released)
    @rule()
    def unlock_twice(self) -> None:
        before = self.cache.stats()
        try:
            self.cache.unlock(self.released[-1])
        except ValueError:
            pass
        else:
            raise AssertionError("a second unlock did not raise")
        assert self.cache.stats() == before

    @rule(pages=st.integers(0, 6))
    def evict(self, pages: int) -> None:
        stats = self.cache.stats()
        evictable = stats["cached_tokens"] - stats["protected_tokens"]
        freed = self.cache.evict(pages * self.ps)
        before = len(self.model)
        self.sync_eviction()
        assert freed == (before - len(self.model)) * self.ps
        assert freed >= min(pages * self.ps, evictable)

    @rule(num=st.integers(0, 40))
    def alloc(self, num: int) -> None:
        slots = self.cache.alloc(num)
        self.sync_eviction()
        if slots is not None:
            assert len(slots) == -(-num // self.ps) * self.ps
            self.held.append(slots)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free(self, data: Any) -> None:
        self.cache.free(self.held.pop(data.draw(st.integers(0, len(self.held) - 1))))

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def free_tree_owned(self, data: Any) -> None:
        slots = data.draw(st.sampled_from(sorted(self.model.values())))
        before = self.cache.stats()
        try:
            self.cache.free(torch.tensor(slots, dtype=torch.int64))
        except ValueError:
            pass
        else:
            raise AssertionError("freeing tree-owned slots did not raise")
        assert self.cache.stats() == before

    # ---------------------------------------------------------------- invariants

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "cache"):
            return
        self.cache.check_invariants()
        assert self.tree_prefixes() == self.model
        stats = self.cache.stats()
        assert stats["cached_tokens"] == len(self.model) * self.ps
        assert stats["held_tokens"] == sum(len(s) for s in self.held)
        assert stats["num_locks"] == len(self.locks)


TreeMachine.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
test_tree_machine = TreeMachine.TestCase
