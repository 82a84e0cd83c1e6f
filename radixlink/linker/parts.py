"""``LinkerParts``: what the loader and the offloader share, built once by the
``ExternalCacheLinker`` facade: the cache, the store and its guard, page codecs and store keys
(``pages.keys.PageKeys``), ranks, the transfer engine (``pages.engine``) and the completions
of the jobs submitted to it, the stored index, the counters and histograms, the cost model,
and the pools a load brings (named by the components taking part: a ``pages.restore.PoolRule``
each, a pool name, hit policy and window; the linker never asks which kind of component or
pool it has).

Owns building those parts and the small bookkeeping both sides use (``Completions``, the
counters). Must not reach the loader, the offloader or the facade: they
are built from it.
"""

from __future__ import annotations

import queue
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from radixlink.contract import PoolName, PoolTransfer
from radixlink.cost import EstimateTracker
from radixlink.linker.breaker import CircuitBreaker, StoreGuard
from radixlink.linker.config import LinkerConfig
from radixlink.linker.ranks import RankGroup
from radixlink.metrics import LatencyHistogram
from radixlink.pages.engine import Completion, Job, TransferEngine, TransferKind
from radixlink.pages.keys import PageKeys
from radixlink.pages.pageio import Codec, make_codec
from radixlink.pages.restore import PoolRule
from radixlink.pages.staging import StagingArena
from radixlink.stores.base import Store
from radixlink.tree.hashes import PageHashMemo
from radixlink.tree.stored import StoredPages


class Completions:
    """Submitted jobs and their finished transfers, ready in an order every rank agrees on:
    each as it arrives with one rank; with several, exactly those finished on every rank (an
    agreed mask over the pending jobs, the same list on every rank), in job order.

    Args:
        engine: the transfer engine the jobs run on.
        ranks: the rank group (a collective per ``ready`` call with several ranks).
    """

    def __init__(self, engine: TransferEngine, ranks: RankGroup):
        self.engine = engine
        self.ranks = ranks
        self.world_size = ranks.world_size
        self._arrived: queue.SimpleQueue[Completion] = queue.SimpleQueue()
        self._pending: set[int] = set()  # submitted, not yet handed out by ready()
        self._done: dict[int, Completion] = {}  # finished here, not yet handed out

    def submit(self, job: Job) -> int:
        job.done = self._arrived.put
        job_id = self.engine.submit(job)
        self._pending.add(job_id)
        return job_id

    def ready(self, block_for: float | None = None) -> list[Completion]:
        """The completions to apply now (each handed out once). With several ranks, call it on
        every rank the same number of times: it is a collective while jobs are pending."""
        arrived, done = self._arrived, self._done
        if block_for is not None or not arrived.empty():
            try:
                item = arrived.get(timeout=block_for)
                while True:
                    done[item.job_id] = item
                    item = arrived.get_nowait()
            except queue.Empty:
                pass
        if self.world_size == 1:
            jobs = list(done)
        else:
            if not self._pending:  # NOTE: the same on every rank, so no collective is skipped
                return []
            pending = sorted(self._pending)
            agreed = self.ranks.all_reduce_min([int(j in done) for j in pending])
            jobs = [job for job, bit in zip(pending, agreed) if bit]
        for job_id in jobs:
            self._pending.discard(job_id)
        return list(map(done.pop, jobs))


class LinkerStats:
    """Counters plus one latency histogram per transfer kind (fed on the caller's thread;
    docs/benchmarks.md, Observability)."""

    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self.load_seconds = LatencyHistogram()
        self.offload_seconds = LatencyHistogram()

    def observe(self, done: Completion) -> None:
        """Record one applied completion's transfer time (failed ones included)."""
        hist = self.load_seconds if done.kind is TransferKind.LOAD else self.offload_seconds
        hist.observe(done.seconds)

    def snapshot(self, offload_stats: dict[str, Any], **gauges: int) -> dict[str, Any]:
        """Counters, the offloader's stats, ``gauges`` and the two histograms' snapshots
        under ``load_seconds`` / ``offload_seconds``."""
        out: dict[str, Any] = dict(self.counters)
        out.update(offload_stats)
        out.update(gauges)
        out["load_seconds"] = self.load_seconds.snapshot()
        out["offload_seconds"] = self.offload_seconds.snapshot()
        return out


@dataclass(slots=True, eq=False, kw_only=True)
class LinkerParts:
    """The shared parts of one linker (see the module docstring). ``stats`` is
    ``metrics.counters``; ``stored`` is the cache tree's stored index, ``hash_memo`` its memo of
    the page hashes lookups computed (both fed by the linker, read by the tree)."""

    cache: Any
    config: LinkerConfig
    store: Store
    guard: StoreGuard
    ranks: RankGroup
    engine: TransferEngine
    jobs: Completions
    arena: StagingArena
    metrics: LinkerStats
    stored: StoredPages
    hash_memo: PageHashMemo
    cost_model: EstimateTracker | None
    page_size: int
    bytes_per_token: int
    world_size: int  # the rank group's (fixed): checked on hot paths without a call
    # the pools a load brings, by the components taking part (backbone first): each one's hit
    # policy and window (trailing pages; 0 for ALL_PAGES)
    pools: list[PoolRule]
    keyspace: PageKeys = field(init=False)
    _codecs: dict[PoolName, Codec] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.keyspace = PageKeys(self.ranks.rank, self.replicated)

    @property
    def stats(self) -> Counter[str]:
        return self.metrics.counters

    def store_keys(self, transfer: PoolTransfer, namespace: Any = None) -> list[str]:
        """Store keys of a transfer's pages: version / namespace / hash / pool [/ rank], in the
        resolved ``namespace`` (``hashing.layer_namespaces`` on the cache's)."""
        return self.keyspace.keys(transfer.name, transfer.keys, namespace)

    def codec(self, name: PoolName) -> Codec:
        """The page codec of pool ``name`` (built once, sealed with the store's secret)."""
        codec = self._codecs.get(name)
        if codec is None:
            pool = self.cache.pool(name)
            if pool is None:
                raise ValueError(f"the cache has no {name.value} pool; build it with a layout")
            codec = make_codec(str(pool.layout.fingerprint(name)), pool.page_bytes,
                               secret=self.store.page_secret)
            self._codecs[name] = codec
        return codec

    def codec_misses(self) -> dict[str, int]:
        """Pages the codecs refused, by reason, over every pool."""
        misses: Counter[str] = Counter()
        for codec in self._codecs.values():
            misses.update({k: v for k, v in codec.stats().items()
                           if k not in ("encoded", "decoded")})
        return dict(misses)

    def adopt_index(self) -> None:
        """Take the tree's stored index over (once attached): empty it (what an earlier linker
        recorded may be another store's) and set its bound (``max_known_pages`` beyond what
        the device pools hold, so the marks of nodes on the device rarely go), age and
        skipping."""
        config, stored = self.config, self.stored
        stored.clear()
        bound = config.max_known_pages
        if bound:
            for rule in self.pools:
                bound += self.cache.pool(rule.name).num_pages
        # NOTE: rank-local knowledge would let ranks write different pages; a zero
        # revalidation age trusts no confirmation: offloads then skip nothing (the index
        # still holds the marks).
        stored.configure(bound, config.revalidate_after_s or 1.0,
                         skips=self.world_size == 1 and config.revalidate_after_s > 0)

    def replicated(self, name: PoolName) -> bool:
        """Whether pool ``name`` is identical on every rank (written by rank 0 only)."""
        pool = self.cache.pool(name)
        return pool is not None and pool.replicated


def build_parts(cache: Any, store: Store, ranks: RankGroup, config: LinkerConfig,
                cost_model: EstimateTracker | None) -> LinkerParts:
    """The parts of a linker on ``cache`` and ``store`` (threads start here)."""
    arena = StagingArena(pinned=cache.device.type == "cuda",
                         max_cached_bytes=min(config.max_inflight_bytes, 256 << 20))
    engine = TransferEngine(store, config.num_threads, arena)
    stored: StoredPages = cache.tree.stored
    loading = [c for c in cache.components if c.takes_part_in_loads]
    return LinkerParts(
        cache=cache, config=config, store=store,
        guard=StoreGuard(store, CircuitBreaker(config.breaker)), ranks=ranks, engine=engine,
        jobs=Completions(engine, ranks), arena=arena, metrics=LinkerStats(), stored=stored,
        hash_memo=cache.tree.hash_memo,
        cost_model=cost_model, page_size=cache.page_size,
        # NOTE: an upper bound: a windowed pool brings its window's pages only
        bytes_per_token=max(1, sum(cache.pool(c.pool_name).token_bytes for c in loading)),
        world_size=ranks.world_size,
        pools=[PoolRule(c.pool_name, c.hit_policy, c.window_pages) for c in loading])
