"""``ExternalCacheLinker``: LOOKUP, LOAD (prepare, transfer, verify, publish, commit or abort)
and OFFLOAD between a ``UnifiedCache`` and a ``Store`` (DESIGN.md section 5b).

Owns the load/offload lifecycle and completion processing. Reaches the tree only through the
cache's public facade (``match_prefix(touch=False)``, ``insert_loaded``, ``lock``) and the
components' linker hooks; store I/O runs on the worker's threads, everything that touches the
tree runs on the caller's thread. Load bookkeeping lives in ``LoadTable``, offload policy in
``OffloadPolicy``.
"""

from __future__ import annotations

import time
from typing import Any

from radixlink.checks import check_namespaced, check_prefill, check_req_id, check_seconds
from radixlink.contract import InsertParams, MatchResult, PoolTransfer
from radixlink.cost import EstimateTracker
from radixlink.linker.breaker import CircuitBreaker, StoreGuard
from radixlink.linker.completions import Completions
from radixlink.linker.config import LinkerConfig
from radixlink.linker.finish import LoadFinisher
from radixlink.linker.hashmemo import PageHashMemo
from radixlink.linker.jobs import load_job
from radixlink.linker.loads import LoadTable, Member, Transfer
from radixlink.linker.lookup import RememberedLookups, find_restorable
from radixlink.linker.offload import OffloadPolicy
from radixlink.linker.outcomes import failure_outcome, landing
from radixlink.linker.phases import lock_device_prefix, release, reserve
from radixlink.linker.progress import LayerProgress
from radixlink.linker.ranks import LocalRankGroup, RankGroup
from radixlink.linker.records import Landing, LoadOutcome, Lookup, kv_bytes_per_token
from radixlink.linker.stats import LinkerStats
from radixlink.linker.storekeys import StoreKeys
from radixlink.linker.worker import Completion, Job, TransferWorker
from radixlink.memory.host import StagingArena
from radixlink.stores.base import Store
from radixlink.stores.registry import open_store

CLOSE_BUDGET_S = 2.0
"""How long ``close()`` lets queued and running offloads go on before it cancels them."""


class ExternalCacheLinker:
    """Links a ``UnifiedCache`` to an external page store.

    Protocol for one request (the engine's thread)::

        m = cache.match_prefix(prompt, req_id=rid)   # device match + store LOOKUP
        if m.external_hit_len and linker.load(rid):  # PREPARE, transfer on a worker thread
            out = linker.wait_load(rid)              # or poll() for many at once
            prefix, slots, handle = out.prefix_len, out.device_indices, out.lock
        else:
            handle = cache.lock(m.last_node)
        ... prefill tokens[prefix:], insert, cache.unlock(handle) ...

    A request that goes away calls ``cancel(rid)`` (a remembered lookup, a queued load or an
    unclaimed outcome is released). Each load has its own deadline (``load_timeout_s`` or
    ``load(timeout_s=)``, counted from ``load()``); it fails that request only.

    Offloads start by themselves after inserts, by ``config.write_policy``; tunables are in
    ``LinkerConfig`` (given as ``config=`` or as keyword arguments of the same names).

    Args:
        cache: the cache (built with ``enable_external_cache_linker=True`` and layouts).
        store: a ``Store`` or a store URL (the linker then owns and closes it).
        ranks: tensor-parallel agreement; the single-process default agrees with itself.
        config: a ``LinkerConfig``; or pass its fields as keyword arguments (``options``).
        cost_model: an ``EstimateTracker`` (radixlink.cost): each lookup then loads the
            restorable length that minimises the request's expected TTFT, possibly shorter or
            none (docs/routing.md); it learns from the linker's loads and ``observe_prefill``.
            None (default): load the largest restorable length. Same setting on every rank.

    Raises:
        ValueError: a bad option, or both ``config`` and options; a store other processes
            reach (anything but ``memory://``) while the cache has no model namespace
            (``CacheConfig.namespace.model``).
    """

    def __init__(self, cache: Any, store: Store | str, *, ranks: RankGroup | None = None,
                 config: LinkerConfig | None = None, cost_model: EstimateTracker | None = None,
                 **options: Any):
        if config is not None and options:
            raise ValueError(f"pass either config= or options {sorted(options)}, not both")
        self.config = config = config or LinkerConfig(**options)
        self._owns_store = isinstance(store, str)
        self.store: Store = open_store(store) if isinstance(store, str) else store
        check_namespaced(cache.config, self.store, close=self._owns_store)
        self.cache = cache
        self.ranks = ranks or LocalRankGroup()
        self.page_size: int = cache.page_size
        self.cost_model = cost_model
        self.bytes_per_token = kv_bytes_per_token(cache)
        self.metrics = LinkerStats()
        self._stats = self.metrics.counters
        self.guard = StoreGuard(self.store, CircuitBreaker(config.breaker))
        self.arena = StagingArena(pinned=cache.device.type == "cuda",
                                  max_cached_bytes=min(config.max_inflight_bytes, 256 << 20))
        self._worker = TransferWorker(self.store, config.num_threads, self.arena)
        self.page_hashes = PageHashMemo(self.page_size)
        self._progress: dict[int, LayerProgress] = {}  # load job -> its landing progress
        # NOTE: with several ranks an age bound would drop a lookup on one rank only.
        ttl = config.lookup_ttl_s if self.ranks.world_size == 1 else None
        self._lookups = RememberedLookups(config.max_lookups, config.max_lookup_bytes, ttl)
        self._loads = LoadTable()
        self._jobs = Completions(self._worker, self.ranks)
        self._closed = False
        self.offload = OffloadPolicy(self, config)
        self.keyspace = StoreKeys(self.ranks.rank, self.offload.replicated)
        self._finisher = LoadFinisher(cache, self.ranks, self.offload, self.page_hashes,
                                      self._stats, cost_model)
        cache.attach_linker(self)

    # ---------------------------------------------------------------- keys

    def store_keys(self, transfer: PoolTransfer, namespace: Any = None) -> list[str]:
        """Store keys of a transfer's pages: version / namespace / hash / pool [/ rank], in the
        resolved ``namespace`` (``hashing.layer_namespaces`` on the cache's)."""
        return self.keyspace.keys(transfer.name, namespace, transfer.keys)

    def page_hashes_for(self, key: bytes, namespace: Any) -> tuple[int, list[str]] | None:
        """Page hashes a recent lookup computed for ``key`` (packed uint32 tokens) in the
        resolved ``namespace``: ``(first page, hashes)``, or None. The cache's insert hands
        them to the tree so a page is hashed once from lookup to insert."""
        return self.page_hashes.hashes_for(key, namespace)

    # ---------------------------------------------------------------- LOOKUP

    def lookup(self, result: MatchResult, key: bytes, req_id: Any, namespace: Any = None) -> None:
        """Fill ``result.external_hit_len`` for the device-uncached whole pages of ``key``
        (packed uint32 tokens, in the resolved ``namespace``) and remember what
        ``load(req_id)`` should fetch. Called by ``cache.match_prefix``; a failed, slow or
        skipped store is a miss (counted), never an exception."""
        found = find_restorable(self, result, key, namespace)
        self._stats["lookups"] += 1
        result.external_hit_len = 0 if found is None else found.num_pages * self.page_size
        if found is not None:
            self._stats["lookup_hit_pages"] += found.num_pages
        self._lookups.put(req_id, found)

    # ---------------------------------------------------------------- LOAD

    def load(self, req_id: Any, *, timeout_s: float | None = None) -> bool:
        """Start the load that ``match_prefix(..., req_id=req_id)`` found.

        Locks the device prefix exactly as the lookup saw it, reserves device slots (PREPARE)
        and queues the transfer; an identical in-flight load is joined instead. Returns False
        (nothing held) when there is nothing to load, the device prefix changed since the
        match, or there is no room; then the caller proceeds with its device prefix.

        Args:
            req_id: the request (as passed to ``match_prefix``).
            timeout_s: this request's deadline, from now (default ``load_timeout_s``).

        Raises:
            ValueError: ``req_id`` already has a load in flight or an outcome not yet taken;
                an unhashable ``req_id``; a ``timeout_s`` that is not a positive number.
                Checked before anything changes.
        """
        check_req_id(req_id)
        limit = self.config.load_timeout_s if timeout_s is None else check_seconds(
            "load(timeout_s=)", timeout_s)
        self._loads.check_new(req_id)
        lookup = self._lookups.pop(req_id)
        if lookup is None or self._closed:
            return False
        locked = lock_device_prefix(self.cache, lookup)
        ok = locked is not None
        if self.ranks.world_size > 1:
            ok = self.ranks.all_ok(ok)
        if not ok:
            if locked is not None:
                self.cache.unlock(locked[0])
            self._stats["stale_lookups"] += 1
            return False
        assert locked is not None
        member = Member(req_id=req_id, lookup=lookup, handle=locked[0], device_slots=locked[1],
                        deadline=time.monotonic() + limit)
        shared = self._loads.shared(lookup)
        if shared is not None:
            self._loads.join(member, shared)
            self._stats["shared_loads"] += 1
            return True
        transfer = self._start_transfer(lookup, locked[1])
        if transfer is None:
            self.cache.unlock(member.handle)
            self._stats["failures_prepare"] += 1
            return False
        self._loads.join(member, transfer)
        self._stats["loads_started"] += 1
        return True

    def _start_transfer(self, lookup: Lookup, device_slots: Any) -> Transfer | None:
        """PREPARE on every component (agreed across ranks) and queue the worker job."""
        reservation = reserve(self.cache, lookup, device_slots)
        # NOTE: one rank short of room fails it on all
        if not self.ranks.all_ok(reservation is not None):
            if reservation is not None:
                release(self.cache, reservation)
            return None
        assert reservation is not None
        job = load_job(reservation.transfers, self.cache, self.offload.codec,
                       lambda t: self.store_keys(t, lookup.namespace), self.arena)
        transfer = Transfer(job_id=self.submit(job), reservation=reservation)
        assert job.progress is not None
        self._progress[transfer.job_id] = job.progress
        self._loads.start(transfer)
        return transfer

    def landing(self, req_id: Any) -> Landing | None:
        """Where the in-flight load of ``req_id`` is landing (``outcomes.landing``): the slots
        of its whole prefix and a per-layer wait, for a forward that starts before the load
        ends; then take the outcome before using the prefix further (its slots are the
        canonical ones). Asking makes the load land layer by layer: call it right after
        ``load``. None when ``req_id`` has no load in flight."""
        member = self._loads.member(check_req_id(req_id))
        if member is None or member.transfer is None:
            return None
        return landing(member, self._progress.get(member.transfer.job_id))

    def cancel(self, req_id: Any) -> bool:
        """The request went away: forget its lookup, leave its queued load (the transfer is
        cancelled when no other request waits on it; its slots are freed when the worker
        returns) and release an outcome it never took. Returns whether anything was held.
        With several ranks, call it on every rank."""
        found = self._lookups.drop(check_req_id(req_id))
        member = self._loads.member(req_id)
        if member is not None:
            self._leave(member)
            self.cache.unlock(member.handle)
            self._stats["cancelled_loads"] += 1
            found = True
        outcome = self._loads.take(req_id)
        if outcome is not None:
            self.cache.unlock(outcome.lock)
            found = True
        return found

    # ---------------------------------------------------------------- completions

    def poll(self) -> list[LoadOutcome]:
        """Finished loads (and finished offloads' bookkeeping) since the last call. Also sends
        the offloads queued since the last call as one batch: call it once per engine step."""
        self.offload.flush_batch()
        self._process()
        self._expire()
        return self._loads.take_all()

    def wait_load(self, req_id: Any, timeout: float | None = None) -> LoadOutcome:
        """Block until the load of ``req_id`` finishes or its deadline passes, and return its
        outcome (a timeout fails this request only; others sharing the transfer go on).

        Args:
            timeout: shortens this request's deadline to ``now + timeout`` (never extends it).

        Raises:
            ValueError: no load was started for ``req_id`` (or its outcome was already taken);
                an unhashable ``req_id`` or a ``timeout`` that is not a number >= 0.
        """
        check_req_id(req_id)
        if timeout is not None:
            check_seconds("wait_load(timeout=)", timeout, allow_zero=True)
        self.offload.flush_batch()
        outcome = self._loads.take(req_id)
        if outcome is not None:
            return outcome
        member = self._loads.member(req_id)
        if member is None:
            raise ValueError(f"no load in flight for request {req_id!r}; call load() first "
                             "(or its outcome was already taken)")
        if timeout is not None:
            member.deadline = min(member.deadline, time.monotonic() + timeout)
        while True:
            left = member.deadline - time.monotonic()
            self._process(block_for=min(max(left, 0.0), 0.05))
            self._expire()
            outcome = self._loads.take(req_id)
            if outcome is not None:
                return outcome

    def _process(self, block_for: float | None = None) -> None:
        """Apply the finished transfers that are ready (``Completions``)."""
        for done in self._jobs.ready(block_for):
            self.metrics.observe(done)
            transfer = self._loads.finish(done.job_id)
            if transfer is not None:
                self._finish_load(transfer, done)
            else:
                self.offload.finish(done)

    def _expire(self) -> None:
        """Members past their own deadline fail now (agreed across ranks); the transfer goes
        on for the others."""
        for member in self._loads.expired(time.monotonic(), self.ranks.any_of):
            self._leave(member)
            self._stats["failures_timeout"] += 1
            self._put(failure_outcome(member, "timeout"))

    def _leave(self, member: Member) -> None:
        transfer = self._loads.leave(member)
        if transfer is not None:  # its last member left: stop the job; ABORT on completion
            self._worker.cancel(transfer.job_id)
            self._stats["cancelled_transfers"] += 1

    def _finish_load(self, transfer: Transfer, done: Completion) -> None:
        self._progress.pop(transfer.job_id, None)
        for outcome in self._finisher.finish(transfer, done, self._closed):
            self._put(outcome)

    def _put(self, outcome: LoadOutcome) -> None:
        if self._closed:  # NOTE: nobody will take it: release its lock now
            self.cache.unlock(outcome.lock)
        else:
            self._loads.put(outcome)

    # ---------------------------------------------------------------- tree hooks, lifecycle

    def on_insert(self, params: InsertParams, result: Any) -> None:
        """Called by ``cache.insert``: count hits, start offloads by the write policy, and
        apply transfers that finished meanwhile."""
        self.offload.on_insert(params, result)
        self._process()

    def before_evict(self, node: Any) -> None:
        """The tree is about to free some of ``node``'s device data (``TreeObserver``)."""
        self.offload.before_evict(node)

    def on_split(self, parent: Any, child: Any) -> None:
        """The tree split ``child`` (``TreeObserver``)."""
        self.offload.on_split(parent, child)

    def submit(self, job: Job) -> int:
        """Queue a worker job whose completion this linker applies."""
        return self._jobs.submit(job)

    def flush(self, timeout: float | None = None) -> bool:
        """Send queued offloads, wait for in-flight offloads (and loads) and apply their
        results; False on timeout."""
        if timeout is not None:
            check_seconds("flush(timeout=)", timeout, allow_zero=True)
        self.offload.flush_batch()
        idle = self._worker.wait_idle(timeout)
        self._process()
        return idle

    def close(self) -> None:
        """Quiesce transfers within ``CLOSE_BUDGET_S`` (then cancel queued ones, leave running
        offloads; running loads are always waited for, so no late write lands in freed slots),
        ABORT loads not yet published, release every lock the linker holds. Idempotent."""
        if self._closed:
            return
        self.offload.flush_batch()
        self._closed = True
        for transfer in self._loads.transfers():  # NOTE: aborted anyway; skip their writes
            self._worker.cancel(transfer.job_id)
        self._worker.close(budget_s=CLOSE_BUDGET_S)
        self._process()
        self.offload.abandon()  # offloads still running: their nodes are not marked
        for outcome in self._loads.take_all():
            self.cache.unlock(outcome.lock)
        self.guard.close()
        self.cache.detach_linker(self)
        if self._owns_store:
            self.store.close()

    def stats(self) -> dict[str, Any]:
        """Counters: lookups, hit pages, loads, loaded pages/tokens/bytes, offloads, offloaded
        pages/bytes, dropped offloads, cancellations, failures by phase, checksum misses; the
        store breaker's state; remembered lookups; and the ``load_seconds`` /
        ``offload_seconds`` histogram snapshots."""
        gauges = {**self._loads.stats(), **self._lookups.stats(), **self.guard.stats()}
        gauges["pending_transfers"] = self._worker.pending
        gauges.update(self.arena.stats())
        gauges["hash_reuses"] = self.page_hashes.hits
        return self.metrics.snapshot(self.offload.stats(), **gauges)

    def count(self, name: str, n: int = 1) -> None:
        self._stats[name] += n

    def observe_prefill(self, num_new: int, num_cached: int, seconds: float) -> None:
        """The engine computed ``num_new`` tokens after ``num_cached`` in ``seconds``: feeds
        the cost model's prefill estimate (a no-op without a cost model).

        Raises:
            ValueError: as ``check_prefill``: bad counts or seconds.
        """
        check_prefill(num_new, num_cached, seconds)
        if self.cost_model is not None:
            self.cost_model.observe_prefill(num_new, num_cached, seconds)

    def __enter__(self) -> ExternalCacheLinker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

