"""Hypothesis state machines over hybrid caches (FULL+SWA, FULL+MAMBA, FULL+SWA+MAMBA): after
every step the invariants hold, the tree equals a page-level model, and the boundaries it
accepts are exactly the model's matchable ones. A brute-force oracle predicts each insert
(adopted FULL / SWA / MAMBA ranges, heals, remaps); evictions must be legal (nothing locked).

Model: ``full`` maps each cached page prefix (tokens) to its last page's slots, ``live`` holds
prefixes whose last page has live SWA, ``states`` maps a prefix to the state at its end.
Boundary ``p`` is matchable when every page up to ``p`` is cached, the pages meeting
``[p - W, p)`` are live (SWA) and a state sits at ``p`` (MAMBA)."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import ComponentType, EvictParams, InsertParams, InsertResult
from radixlink.memory.layout import StateLayout
from radixlink.tree.keys import key_tokens

FULL, SWA, MAMBA = ComponentType.FULL, ComponentType.SWA, ComponentType.MAMBA
Prefix = tuple[int, ...]
PAGES = st.lists(st.integers(0, 1), max_size=4)  # few keys: they overlap often
TAIL = st.integers(0, 7)
# swa_evicted_seqlen as (pages, tokens below that boundary)
SEV = st.one_of(st.just((0, 0)), st.tuples(st.integers(0, 5), st.integers(0, 3)))


class HybridMachine(RuleBasedStateMachine):
    """Rules (serve, insert, match, lock, evict, alloc, free, states) against the page model."""

    KINDS: tuple[ComponentType, ...] = (SWA, MAMBA)

    @initialize(
        page_size=st.sampled_from([1, 2, 4]),
        window=st.tuples(st.integers(1, 3), st.integers(0, 3)),  # (pages, tokens short of it)
        num_pages=st.integers(6, 14),
        swa_pages=st.integers(4, 10),
        num_states=st.integers(3, 6),
        tensors=st.booleans(),
    )
    def setup(self, page_size: int, window: tuple[int, int], num_pages: int, swa_pages: int,
              num_states: int, tensors: bool) -> None:
        kinds = self.KINDS
        window = window[0] * page_size - window[1] % page_size
        self.ps, self.swa, self.mamba = page_size, SWA in kinds, MAMBA in kinds
        self.window = window if self.swa else 0
        if self.swa:
            event("window is a page multiple" if window % page_size == 0 else "window unaligned")
        tensors = tensors and self.mamba
        layout = StateLayout(shapes=((2,),), dtype=torch.float32) if tensors else None
        self.cache = UnifiedCache(CacheConfig(
            page_size=page_size, num_tokens=num_pages * page_size,
            sliding_window=window if self.swa else None,
            swa_num_tokens=swa_pages * page_size if self.swa else None,
            mamba_num_states=num_states if self.mamba else None, state_layout=layout,
        ))
        self.states_pool = self.cache.pool("mamba")
        self.full: dict[Prefix, tuple[int, ...]] = {}
        self.live: set[Prefix] = set()
        self.states: dict[Prefix, int] = {}
        self.state_value: dict[int, float] = {}
        self.locks: list[tuple[Any, Prefix, int]] = []  # handle, path tokens, SWA reach
        self.held: list[tuple[torch.Tensor, int]] = []  # full slots, mapped SWA tokens
        self.held_states: list[int] = []
        self.next_value = 1.0

    # ---------------------------------------------------------------- model helpers

    def key(self, pages: list[int], tail: int) -> list[int]:
        ps = self.ps
        return [10 * c + (i % 3) for c in pages for i in range(ps)] + [9] * (tail % ps)

    def sev(self, drawn: tuple[int, int]) -> int:
        if not self.swa:
            return 0
        sev = max(0, drawn[0] * self.ps - drawn[1] % self.ps)
        event("swa_evicted_seqlen unaligned" if sev % self.ps else "swa_evicted_seqlen aligned")
        return sev

    def matchable(self, key: list[int] | Prefix, p: int) -> bool:
        ends = range(self.ps, p + 1, self.ps)
        return p == 0 or (
            all(tuple(key[:e]) in self.full for e in ends)
            and not (self.swa and any(tuple(key[:e]) not in self.live
                                      for e in ends if e > p - self.window))
            and (not self.mamba or tuple(key[:p]) in self.states)
        )

    def locked_prefixes(self) -> set[Prefix]:
        paths = [path for _, path, _ in self.locks]
        return {path[:e] for path in paths for e in range(self.ps, len(path) + 1, self.ps)}

    def tree_view(self) -> tuple[dict[Prefix, tuple[int, ...]], set[Prefix], dict[Prefix, int]]:
        """The cached prefixes, live SWA pages and states, read straight from the tree."""
        full: dict[Prefix, tuple[int, ...]] = {}
        live: set[Prefix] = set()
        states: dict[Prefix, int] = {}
        tree, ps = self.cache.tree, self.ps
        for node in tree.iter_nodes():
            path = tree.path_to(node)
            if any(n.values[0] is None for n in path):
                continue
            tokens = tuple(t for n in path for t in key_tokens(n.key).tolist())
            slots = node.values[0].tolist()
            value = node.values[1] if self.swa else None
            live_from = node.seq_len - (0 if value is None else len(value))
            for k in range(0, node.num_tokens, ps):
                end = node.start + k + ps
                full[tokens[:end]] = tuple(slots[k : k + ps])
                if end - ps >= live_from:
                    live.add(tokens[:end])
            if self.mamba and node.values[-1] is not None:
                states[tokens] = node.values[-1]
        return full, live, states

    def sync_eviction(self) -> None:
        """After anything that may evict: only legal data went; adopt the tree's view."""
        full, live, states = self.tree_view()
        assert full.keys() <= self.full.keys() and live <= self.live, "eviction added data"
        assert all(self.full[p] == s for p, s in full.items()), "cached slots changed"
        assert states.items() <= self.states.items(), "eviction added or moved states"
        locked = self.locked_prefixes()
        for prefix in self.full.keys() - full.keys():
            assert prefix not in locked, f"locked prefix {prefix} lost its full KV"
            assert not any(o[: len(prefix)] == prefix for o in full), "evicted before extension"
        for prefix in self.live - live:
            for _, path, reach in self.locks:
                protected = path[: len(prefix)] == prefix and len(prefix) > reach
                assert not protected, f"SWA data of {prefix} in a locked window was evicted"
        for prefix in self.states.keys() - states.keys():
            assert prefix not in {path for _, path, _ in self.locks}, "a locked state went"
            self.state_value.pop(self.states[prefix], None)
        if full != self.full or live != self.live or states != self.states:
            event("evicted")
        self.full, self.live, self.states = full, live, states

    # ---------------------------------------------------------------- requests

    @rule(pages=PAGES, tail=TAIL, sev=SEV, hole=st.integers(-4, 4), forget=st.booleans(),
          state=st.booleans())
    def serve(self, pages: list[int], tail: int, sev: tuple[int, int], hole: int, forget: bool,
              state: bool) -> None:
        """match -> lock -> alloc -> drop SWA below sev -> insert(prev = hit) -> unlock."""
        key = self.key(pages, tail)
        m = self.cache.match_prefix(key)
        self.sync_eviction()
        handle = self.cache.lock(m.last_node)
        self.locks.append(self.lock_record(handle))
        new = self.cache.alloc(len(key) - m.prefix_len)
        self.sync_eviction()
        if new is None:
            event("alloc refused")
        else:
            kv = torch.cat([m.device_indices, new])
            self.insert_and_check(key, kv, m.prefix_len, self.sev(sev), hole, forget, state)
        self.locks.pop()
        self.cache.unlock(handle)

    @rule(pages=PAGES, tail=TAIL, sev=SEV, state=st.booleans(), lock_first=st.booleans())
    def insert_fresh(self, pages: list[int], tail: int, sev: tuple[int, int], state: bool,
                     lock_first: bool) -> None:
        """All-fresh slots with prev = 0: cached pages are duplicates that may heal SWA (by
        remapping where ``lock_first`` locked the matched part: the lock is kept)."""
        key = self.key(pages, tail)
        if lock_first:
            self.lock(pages)
        kv = self.cache.alloc(len(key))
        self.sync_eviction()
        if kv is not None:
            self.insert_and_check(key, kv, 0, self.sev(sev), -1, False, state)

    @precondition(lambda self: self.swa)
    @rule(pages=st.lists(st.integers(0, 1), min_size=2, max_size=4), sev=st.integers(1, 3),
          again=st.booleans())
    def refill_locked(self, pages: list[int], sev: int, again: bool) -> None:
        """Serve ``pages`` dropping SWA below ``sev`` (``again``), lock the matched prefix,
        then insert the key with every SWA page live: dead SWA on the locked path heals by
        remapping, elsewhere by replacing full slots."""
        if again:  # keep the last window live, so the lock below covers the dead pages
            room = max(0, len(pages) * self.ps - self.window) // self.ps
            self.serve(pages, 0, (min(sev, room), 0), -1, False, False)
        self.insert_fresh(pages, 0, (0, 0), False, True)

    def insert_and_check(self, key: list[int], kv: torch.Tensor, prev: int, sev: int,
                         hole: int, forget: bool, with_state: bool) -> None:
        ps, aligned = self.ps, len(key) // self.ps * self.ps
        mapped = [True] * ((aligned - prev) // ps)
        if self.swa:
            gone = [k for k in range(len(mapped)) if prev + (k + 1) * ps <= sev and not forget]
            if 0 <= hole < len(mapped):
                gone.append(hole)
            for k in set(gone):
                self.cache.hybrid.free_swa(kv[prev + k * ps : prev + (k + 1) * ps])
                mapped[k] = False
        state = self.cache.hybrid.alloc_state() if self.mamba and with_state else None
        self.sync_eviction()
        if state is not None and self.states_pool is not None:
            self.states_pool.tensors(0)[state] = self.next_value
        expected = self.oracle(key, kv, prev, sev, mapped, state)
        result = self.cache.insert(InsertParams(
            key=key, value=kv[:aligned], prev_prefix_len=prev, swa_evicted_seqlen=sev,
            mamba_value=state, track_adopted_ranges=True,
        ))
        assert result.adopted_ranges == expected.adopted_ranges
        assert result.prefix_len == expected.prefix_len
        for comp in expected.adopted_ranges:
            event(f"adopted {comp.value}")
        if len(kv) > aligned:
            self.cache.free(kv[aligned:])

    def oracle(self, key: list[int], kv: torch.Tensor, prev: int, sev: int,
               mapped: list[bool], state: int | None) -> InsertResult:
        """Brute force, page by page: what the insert adopts; updates the model."""
        ps, aligned = self.ps, len(key) // self.ps * self.ps
        live_start = max(prev, -(-sev // ps) * ps)
        holes = [k for k, ok in enumerate(mapped) if not ok]
        if holes:
            live_start = max(live_start, prev + (holes[-1] + 1) * ps)
        locked = self.locked_prefixes()
        cached = 0
        while cached < aligned and tuple(key[: cached + ps]) in self.full:
            cached += ps
        out = InsertResult(prefix_len=cached)
        for end in range(ps, aligned + 1, ps):
            prefix, start, slots = tuple(key[:end]), end - ps, tuple(kv[end - ps : end].tolist())
            if prefix not in self.full:
                self.full[prefix] = slots
                out.record_adopted_range(FULL, start, end)
            elif start < prev or start < live_start or prefix in self.live or not self.swa:
                continue
            elif prefix in locked:
                event("heal by remap")
            else:
                event("heal by replacing full slots")
                self.full[prefix] = slots
                out.record_adopted_range(FULL, start, end)
            if self.swa and start >= live_start:
                self.live.add(prefix)
                out.record_adopted_range(SWA, start, end)
        if state is not None:
            if aligned == 0 or tuple(key[:aligned]) in self.states:
                event("duplicate state dropped")
            else:
                self.states[tuple(key[:aligned])] = state
                self.state_value[state] = self.next_value
                out.record_adopted_range(MAMBA, aligned - ps, aligned)
            self.next_value += 1
        return out

    def lock_record(self, handle: Any) -> tuple[Any, Prefix, int]:
        node, tree = handle.node, self.cache.tree
        path = tuple(t for n in tree.path_to(node) for t in key_tokens(n.key).tolist())
        reach = max(0, node.start + self.ps - self.window) if node.parent else len(path)
        return handle, path, reach

    @rule(pages=PAGES, tail=TAIL)
    def match(self, pages: list[int], tail: int) -> None:
        key, ps = self.key(pages, tail), self.ps
        best = max(p for p in range(0, len(key) // ps * ps + 1, ps) if self.matchable(key, p))
        m = self.cache.match_prefix(key)
        assert m.prefix_len == best, f"matched {m.prefix_len}, model {best}"
        assert self.tree_view() == (self.full, self.live, self.states), "match changed the tree"
        p = m.prefix_len
        expected = [s for e in range(self.ps, p + 1, self.ps) for s in self.full[tuple(key[:e])]]
        assert m.device_indices.tolist() == expected
        if self.swa:
            n = min(p, -(-self.window // self.ps) * self.ps)
            assert m.swa_indices is not None and bool((m.swa_indices != 0).all())
            assert torch.equal(m.swa_indices,
                               self.cache.hybrid.swa_slots(m.device_indices[p - n :]))
            run = 0
            while run < p and tuple(key[: p - run]) in self.live:
                run += self.ps
            assert m.swa_live_len == run
        if self.mamba and p:
            tree_slot = self.states[tuple(key[:p])]
            assert m.mamba_slot == tree_slot
            handle = self.cache.lock(m.last_node)
            mine = self.cache.hybrid.copy_state(m.last_node)  # may evict another state
            self.cache.unlock(handle)
            self.sync_eviction()
            if mine is None:
                event("copy refused: every other state slot held or locked")
            else:
                if self.states_pool is not None:
                    copy = self.states_pool.tensors(0)[mine]
                    assert bool((copy == self.state_value[tree_slot]).all())
                    copy.fill_(-1.0)  # the request writes its copy; the tree's is untouched
                    assert bool((self.states_pool.tensors(0)[tree_slot] != -1.0).all())
                self.cache.hybrid.free_state(mine)

    @rule(pages=PAGES)
    def lock(self, pages: list[int]) -> None:
        m = self.cache.match_prefix(self.key(pages, 0))
        self.sync_eviction()
        self.locks.append(self.lock_record(self.cache.lock(m.last_node)))

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data: Any) -> None:
        self.cache.unlock(self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))[0])

    @rule(full=st.integers(0, 4), swa=st.integers(0, 4), mamba=st.integers(0, 2))
    def evict(self, full: int, swa: int, mamba: int) -> None:
        result = self.cache.evict(EvictParams(
            num_tokens=full * self.ps, swa_num_tokens=swa * self.ps if self.swa else 0,
            mamba_num=mamba if self.mamba else 0,
        ))
        before = len(self.full)
        self.sync_eviction()
        assert result.num_tokens_evicted == (before - len(self.full)) * self.ps

    @rule(num=st.integers(0, 12))
    def alloc(self, num: int) -> None:
        slots = self.cache.alloc(num)
        self.sync_eviction()
        self.held += [] if slots is None else [(slots, len(slots) if self.swa else 0)]

    @precondition(lambda self: self.held)
    @rule(data=st.data(), swa_only=st.booleans())
    def free(self, data: Any, swa_only: bool) -> None:
        slots, _ = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        if swa_only and self.swa:
            self.cache.hybrid.free_swa(slots)
            self.held.append((slots, 0))
        else:
            self.cache.free(slots)

    @precondition(lambda self: self.mamba and len(self.held_states) < 2)
    @rule()
    def alloc_state(self) -> None:
        slot = self.cache.hybrid.alloc_state()
        self.sync_eviction()
        self.held_states += [] if slot is None else [slot]

    @precondition(lambda self: self.held_states)
    @rule()
    def free_state(self) -> None:
        self.cache.hybrid.free_state(self.held_states.pop())

    @precondition(lambda self: self.states)
    @rule(data=st.data())
    def free_tree_state(self, data: Any) -> None:
        with pytest.raises(ValueError, match="belongs to the tree"):
            self.cache.hybrid.free_state(data.draw(st.sampled_from(sorted(self.states.values()))))

    # ---------------------------------------------------------------- invariants

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "cache"):
            return
        self.cache.check_invariants()
        assert self.tree_view() == (self.full, self.live, self.states)
        stats = self.cache.stats()
        assert stats["held_tokens"] == sum(len(s) for s, _ in self.held)
        assert stats["num_locks"] == len(self.locks)
        if self.swa:
            assert stats["swa_held_tokens"] == sum(n for _, n in self.held)
        if self.mamba:
            assert stats["mamba_held_states"] == len(self.held_states)
        # Read-only: a node boundary all components accept is model-matchable, and back.
        tree, ps = self.cache.tree, self.ps
        for node in tree.iter_nodes():
            path = tree.path_to(node)
            tokens = tuple(t for n in path for t in key_tokens(n.key).tolist())
            for p in range(node.start + ps, node.seq_len + 1, ps):
                limit = p
                while True:
                    start = limit
                    for component in tree.components:
                        limit = component.match_accept(path, limit)
                    if limit == start:
                        break
                assert (limit == p) == self.matchable(tokens, p), f"boundary {p} of {tokens}"


class SWAMachine(HybridMachine):
    KINDS = (SWA,)


class MambaMachine(HybridMachine):
    KINDS = (MAMBA,)


for _machine in (SWAMachine, MambaMachine, HybridMachine):
    _machine.TestCase.settings = settings(
        max_examples=30, stateful_step_count=20, deadline=None, derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
test_full_swa_machine = SWAMachine.TestCase
test_full_mamba_machine = MambaMachine.TestCase
test_full_swa_mamba_machine = HybridMachine.TestCase
