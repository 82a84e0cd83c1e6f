"""The ranks fuzz (issue #44): N simulated tensor-parallel ranks (threads meeting in a
``SimulatedWorld``) run one random request stream, each with its own cache, linker and faulty
store (errors, corrupt and truncated pages, delays; the last rank slow against a 25 ms breaker
budget) over ONE shared memory store, which loses one rank's ``/r<k>`` pages at random steps.

What must hold (``run`` checks it and raises on the first violation):

- the collectives pair: every rank makes the same sequence of (kind, size) collectives
  (``RecordingGroup``), so none is mismatched, skipped or entered alone;
- every rank serves the same prefix for every request (and agrees whether its load worked);
- every served prefix holds exactly the model's data for the request's whole history
  (tests/oracle.py: full K/V, SWA window, Mamba state), and so does every tree page;
- accounting is exact after every step (invariants; free + cached + held == total per pool;
  nothing held outside the tree while no load is in flight) and at the end (after close and
  evicting everything, every pool hands out its whole capacity).

Owns nothing of the library; uses its public API, the oracle and ``SimulatedWorld``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import oracle
import torch
from hybrid_kit import LAYOUT, PS, STATE, WINDOW

from faults.recording_ranks import RecordingGroup
from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import EvictParams, InsertParams, PoolName
from radixlink.hashing import Namespace
from radixlink.linker import RankGroup
from radixlink.linker.breaker import BreakerConfig
from radixlink.linker.config import WRITE_POLICIES
from radixlink.linker.core import ExternalCacheLinker
from radixlink.linker.ranks import run_ranks
from radixlink.stores.faults import FaultyStore
from radixlink.stores.memory import MemoryStore

KINDS = ("full", "swa", "mamba")
POLICIES = WRITE_POLICIES
NAMESPACE = Namespace(model="ranks-fuzz")
BUDGET_S = 0.025  # the breaker's budget for store calls on the engine's thread
LOAD_TIMEOUT_S = 0.3
Op = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Config:
    """One fuzz run: ``world_size`` ranks on caches of ``kind`` under write ``policy``."""

    world_size: int
    kind: str
    policy: str
    seed: int
    steps: int = 40


@dataclass(slots=True)
class Summary:
    """What one run covered (the same on every rank unless noted)."""

    steps: int = 0
    requests: int = 0
    loads_ok: int = 0
    loads_failed: int = 0
    collectives: int = 0
    lost_pages: int = 0
    counters: dict[str, int] = field(default_factory=dict)  # summed over ranks


# ---------------------------------------------------------------- the request stream


def tokens_of(pages: list[int], tail: int) -> list[int]:
    """Whole pages chosen from three variants per position (so prefixes share and diverge),
    then ``tail`` tokens of a partial page."""
    return [10 + 10 * choice + i for choice in pages for i in range(PS)] + [7] * tail


def script(cfg: Config) -> list[Op]:
    """The ops every rank runs, in order (from ``cfg.seed``; per-rank fault knobs included)."""
    rng = random.Random(cfg.seed)
    ops: list[Op] = [("faults", _knobs(rng, cfg.world_size))]

    def seq() -> list[int]:
        return [rng.choice((0, 0, 1, 2)) for _ in range(rng.randint(1, 7))]

    for _ in range(cfg.steps):
        r = rng.random()
        if r < 0.45:
            ops.append(("request", tokens_of(seq(), rng.randint(0, PS - 1)), rng.random() < 0.5))
        elif r < 0.57:
            ops.append(("start", tokens_of(seq(), 0), rng.randint(1, 3), rng.random() < 0.5))
        elif r < 0.65:
            ops.append(("wait", rng.randint(0, 7), rng.choice((None, None, 0.0, 0.05))))
        elif r < 0.71:
            ops.append(("poll",))
        elif r < 0.74:
            ops.append(("cancel", rng.randint(0, 7)))
        elif r < 0.77:
            ops.append(("evict", rng.randint(0, 24), rng.randint(0, 16), rng.randint(0, 3)))
        elif r < 0.80:
            ops.append(("stale", tokens_of(seq(), 0), rng.randint(0, 8), rng.randint(0, 8),
                        rng.randint(0, 2)))
        elif r < 0.84:
            ops.append(("flush",))
        elif r < 0.88:
            ops.append(("lose", rng.randrange(cfg.world_size), rng.choice((1, 3, 6))))
        else:
            ops.append(("faults", _knobs(rng, cfg.world_size)))
    return ops


def _knobs(rng: random.Random, world_size: int) -> list[dict[str, float]]:
    """Per rank: its store's fault knobs; the last rank is slow against the breaker budget.
    Two sets in five are calm (only that slowness), so that loads also succeed."""
    calm = rng.random() < 0.4
    out = []
    for rank in range(world_size):
        slow = rank == world_size - 1
        if calm:
            out.append({"fail": 0.0, "corrupt": 0.0, "truncate": 0.0, "get_delay_ms": 0.0,
                        "delay_ms": rng.choice((5.0, 10.0, 30.0)) if slow else 0.0})
            continue
        out.append({
            "fail": rng.choice((0.0, 0.0, 0.0, 0.05, 0.2)),
            "corrupt": rng.choice((0.0, 0.0, 0.0, 0.1, 0.5)),
            "truncate": rng.choice((0.0, 0.0, 0.0, 0.0, 0.2)),
            "delay_ms": rng.choice((5.0, 10.0, 15.0, 30.0)) if slow else rng.choice(
                (0.0, 0.0, 0.0, 2.0)),
            "get_delay_ms": rng.choice((0.0, 0.0, 0.0, 0.0, 0.0, 60.0, 400.0)),
        })
    return out


# ---------------------------------------------------------------- one rank


def make_cache(kind: str) -> UnifiedCache:
    """A small cache (16 pages, a 6-page SWA pool, 6 states): the stream evicts all the time."""
    swa, mamba = kind == "swa", kind == "mamba"
    return UnifiedCache(CacheConfig(
        page_size=PS, num_tokens=16 * PS, kv_layout=LAYOUT, namespace=NAMESPACE,
        sliding_window=WINDOW if swa else None, swa_num_tokens=6 * PS if swa else None,
        swa_layout=LAYOUT if swa else None, mamba_num_states=6 if mamba else None,
        state_layout=STATE if mamba else None, enable_external_cache_linker=True))


class Rank:
    """One rank's cache, linker and stores, running the script."""

    def __init__(self, group: RankGroup, cfg: Config, shared: MemoryStore):
        self.cfg, self.shared = cfg, shared
        self.group = RecordingGroup(group)
        self.rank = group.rank
        self.slow_get = FaultyStore(shared, ops=("get",))
        self.store = FaultyStore(self.slow_get, seed=cfg.seed * 101 + self.rank)
        self.cache = make_cache(cfg.kind)
        self.linker = ExternalCacheLinker(
            self.cache, self.store, ranks=self.group, write_policy=cfg.policy,
            load_timeout_s=LOAD_TIMEOUT_S, revalidate_after_s=0.05, num_threads=2,
            breaker=BreakerConfig(budget_s=BUDGET_S, cooldown_s=0.1, max_cooldown_s=0.4))
        self.pending: dict[str, list[int]] = {}
        self.served: list[tuple[str, int, bool | None]] = []
        self.summary = Summary()

    # ------------------------------------------------------------ ops

    def run(self, ops: list[Op]) -> Rank:
        for step, op in enumerate(ops):
            getattr(self, "op_" + op[0])(f"s{step}", *op[1:])
            self.check_step(op)
        self.finish_all()
        return self

    def op_request(self, rid: str, tokens: list[int], cold: bool) -> None:
        if cold:
            self.cache.evict(len(tokens))
        self.begin(rid, tokens, wait=True)

    def op_start(self, rid: str, tokens: list[int], num: int, cold: bool) -> None:
        if cold:
            self.cache.evict(len(tokens))
        for i in range(num):
            self.begin(f"{rid}.{i}", tokens, wait=False)

    def op_wait(self, _rid: str, index: int, timeout: float | None) -> None:
        if self.pending:
            rid = sorted(self.pending)[index % len(self.pending)]
            self.finish(self.linker.wait_load(rid, timeout=timeout))

    def op_poll(self, _rid: str) -> None:
        for out in sorted(self.linker.poll(), key=lambda o: o.req_id):
            self.finish(out)

    def op_cancel(self, _rid: str, index: int) -> None:
        if self.pending:
            rid = sorted(self.pending)[index % len(self.pending)]
            assert self.linker.cancel(rid), f"rank {self.rank}: {rid} held nothing"
            del self.pending[rid]
            self.served.append((rid, -1, None))

    def op_evict(self, _rid: str, full: int, swa: int, mamba: int) -> None:
        kind = self.cfg.kind
        self.cache.evict(EvictParams(num_tokens=full * PS,
                                     swa_num_tokens=swa * PS if kind == "swa" else 0,
                                     mamba_num=mamba if kind == "mamba" else 0))

    def op_stale(self, rid: str, tokens: list[int], full: int, swa: int, mamba: int) -> None:
        """Eviction between the lookup and ``load()``: the load refuses a device prefix that
        shrank (stale) or loads after exactly what it then locked."""
        m = self.cache.match_prefix(tokens, req_id=rid)
        self.op_evict(rid, full, swa, mamba)
        if m.external_hit_len and self.linker.load(rid):
            self.pending[rid] = tokens
            return
        self.linker.cancel(rid)  # NOTE: drops the lookup when load() was never called
        self.begin(rid, tokens, wait=True)

    def op_flush(self, _rid: str) -> None:
        self.linker.flush(timeout=10)

    def op_lose(self, _rid: str, victim: int, every: int) -> None:
        """The shared store loses some of rank ``victim``'s pages (one rank does it, while
        the others go on: a store evicts when it likes)."""
        if self.rank != 0:
            return
        keys = [key for key, _ in self.shared.scan() if key.endswith(f"/r{victim}")]
        self.summary.lost_pages += self.shared.delete(keys[::every])

    def op_faults(self, _rid: str, knobs: list[dict[str, float]]) -> None:
        mine = knobs[self.rank]
        store = self.store
        store.fail, store.corrupt, store.truncate = mine["fail"], mine["corrupt"], mine["truncate"]
        store.delay_ms = mine["delay_ms"]
        self.slow_get.delay_ms = mine["get_delay_ms"]

    # ------------------------------------------------------------ one request

    def begin(self, rid: str, tokens: list[int], *, wait: bool) -> None:
        """match (+ LOOKUP) -> load (waited for, or left pending) -> compute -> insert."""
        m = self.cache.match_prefix(tokens, req_id=rid)
        assert oracle.served_matches(self.cache, m, tokens), f"{rid}: device match wrong data"
        if m.external_hit_len and self.linker.load(rid):
            self.pending[rid] = tokens
            if wait:
                self.finish(self.linker.wait_load(rid))
            return
        self.summary.requests += 1
        self.served.append((rid, m.prefix_len, None))
        self.compute(tokens, m.prefix_len, m.device_indices, self.cache.lock(m.last_node),
                     m.last_node)

    def finish(self, out: Any) -> None:
        tokens = self.pending.pop(out.req_id)
        self.summary.requests += 1
        self.summary.loads_ok += out.ok
        self.summary.loads_failed += not out.ok
        self.served.append((out.req_id, out.prefix_len, out.ok))
        assert out.device_indices.numel() == out.prefix_len
        if out.ok:
            assert out.match is not None and out.match.prefix_len == out.prefix_len
            assert oracle.served_matches(self.cache, out.match, tokens), (
                f"rank {self.rank}: {out.req_id} served wrong data")
        self.compute(tokens, out.prefix_len, out.device_indices, out.lock, out.last_node)

    def compute(self, tokens: list[int], prefix: int, slots: torch.Tensor, handle: Any,
                node: Any) -> None:
        """The model: check the reused prefix, compute the rest, insert whole pages (SWA: the
        window's pages only; MAMBA: the state at the end), unlock."""
        cache = self.cache
        assert oracle.kv_matches(cache, slots, tokens[:prefix]), f"rank {self.rank}: wrong K/V"
        states = cache.pool(PoolName.MAMBA)
        if states is not None and prefix:  # the request's own copy of the state at prefix
            copy = cache.hybrid.copy_state(node)
            if copy is not None:
                assert torch.equal(states.read_state(copy), oracle.state(cache, tokens[:prefix]))
                cache.hybrid.free_state(copy)
        new = cache.alloc(len(tokens) - prefix)
        if new is None:
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

    # ------------------------------------------------------------ checks

    def check_step(self, op: Op) -> None:
        """Invariants, per-pool accounting, nothing held while no load is in flight, and every
        tree page is the model's."""
        cache = self.cache
        cache.check_invariants()
        s = cache.stats()
        quiet = not self.pending and not self.linker.stats()["loads_in_flight"]
        for prefix, total in _pools(cache):
            held = s[prefix + "held" + ("_states" if prefix == "mamba_" else "_tokens")]
            assert _sum(s, prefix) == total, (self.rank, op[0], s)
            assert not quiet or held == 0, f"rank {self.rank} after {op[0]}: held {held}: {s}"
        oracle.verify_tree(cache)
        self.summary.steps += 1

    def finish_all(self) -> None:
        """Take every outcome, flush, close; then exact accounting and every pool whole."""
        for rid in sorted(self.pending):
            self.finish(self.linker.wait_load(rid, timeout=10))
        self.linker.flush(timeout=10)
        self.summary.collectives = len(self.group.calls)
        self.summary.counters = {k: v for k, v in self.linker.stats().items()
                                 if isinstance(v, int)}
        self.linker.close()
        cache = self.cache
        cache.check_invariants()
        s = cache.stats()
        assert s["num_locks"] == 0 and s["held_tokens"] == 0, s
        oracle.verify_tree(cache)
        cache.evict(EvictParams(num_tokens=10**6,
                                swa_num_tokens=10**6 if self.cfg.kind == "swa" else 0,
                                mamba_num=10**6 if self.cfg.kind == "mamba" else 0))
        s = cache.stats()
        for prefix, total in _pools(cache):
            free = s[prefix + "free" + ("_states" if prefix == "mamba_" else "_tokens")]
            assert free == total, f"rank {self.rank}: {prefix or 'kv '}pool leaked: {s}"


def _pools(cache: UnifiedCache) -> list[tuple[str, int]]:
    """(stats prefix, capacity) per pool of ``cache``."""
    out = [("", cache.stats()["total_tokens"])]
    if cache.pool(PoolName.SWA) is not None:
        out.append(("swa_", 6 * PS))
    if cache.pool(PoolName.MAMBA) is not None:
        out.append(("mamba_", 6))
    return out


def _sum(stats: dict[str, Any], prefix: str) -> int:
    unit = "_states" if prefix == "mamba_" else "_tokens"
    return sum(stats[prefix + part + unit] for part in ("free", "cached", "held"))


# ---------------------------------------------------------------- the driver


def run(cfg: Config, timeout_s: float = 30.0) -> Summary:
    """Run ``cfg`` on ``cfg.world_size`` simulated ranks and check that they agreed (see the
    module docstring); the summary of the run (counters summed over ranks)."""
    shared = MemoryStore(capacity_bytes=4 << 20)
    ops = script(cfg)
    ranks = run_ranks(cfg.world_size, lambda group: Rank(group, cfg, shared).run(ops),
                      timeout_s=timeout_s)
    first = ranks[0]
    for other in ranks[1:]:
        _same_calls(first, other)
        assert other.served == first.served, (
            f"{cfg}: rank {other.rank} served other prefixes than rank 0: "
            f"{_first_diff(first.served, other.served)}")
    summary = first.summary
    summary.lost_pages = sum(r.summary.lost_pages for r in ranks)
    counters: dict[str, int] = {}
    for r in ranks:
        for key, value in r.summary.counters.items():
            counters[key] = counters.get(key, 0) + value
    summary.counters = counters
    shared.close()
    return summary


def _same_calls(a: Rank, b: Rank) -> None:
    if a.group.calls != b.group.calls:
        i = _first_diff(a.group.calls, b.group.calls)
        raise AssertionError(f"rank {b.rank}'s collectives differ from rank 0's at #{i}: "
                             f"{a.group.calls[i:i + 3]} vs {b.group.calls[i:i + 3]}")


def _first_diff(a: list[Any], b: list[Any]) -> Any:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))
