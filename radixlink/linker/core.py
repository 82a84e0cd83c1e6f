"""``ExternalCacheLinker``: LOOKUP, LOAD (prepare, transfer, verify, publish, commit or abort)
and OFFLOAD between a ``UnifiedCache`` and a ``Store`` (DESIGN.md section 5b).

Owns the load/offload lifecycle and completion processing. Reaches the tree only through the
cache's public facade (``peek_prefix``, ``insert_loaded``, ``lock``) and the components' linker
hooks; store I/O runs on the worker's threads, everything that touches the tree runs on the
caller's thread. Load bookkeeping lives in ``LoadTable``, offload policy in ``OffloadPolicy``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from radixlink.contract import InsertParams, MatchResult, PoolTransfer
from radixlink.linker.breaker import BreakerConfig, CircuitBreaker, StoreGuard
from radixlink.linker.hashmemo import PageHashMemo
from radixlink.linker.jobs import load_job
from radixlink.linker.loads import LoadTable, Member, Transfer
from radixlink.linker.lookup import RememberedLookups, find_restorable
from radixlink.linker.offload import OffloadPolicy, WritePolicy
from radixlink.linker.phases import lock_device_prefix, publish, release, reserve
from radixlink.linker.progress import LayerProgress
from radixlink.linker.ranks import LocalRankGroup, RankGroup
from radixlink.linker.records import Landing, LoadOutcome, Lookup
from radixlink.linker.staging import StagingArena
from radixlink.linker.stats import LinkerStats
from radixlink.linker.storekeys import StoreKeys
from radixlink.linker.worker import Completion, Job, TransferStatus, TransferWorker
from radixlink.stores.base import Store
from radixlink.stores.registry import open_store


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

    Offloads start by themselves after inserts, by ``write_policy``: ``write_through``
    (a node's first hit, its creating insert included), ``write_through_selective`` (its
    ``write_through_threshold``-th hit) or ``write_back`` (just before eviction frees it).

    Args:
        cache: the cache (built with ``enable_external_cache_linker=True`` and layouts).
        store: a ``Store`` or a store URL (the linker then owns and closes it).
        ranks: tensor-parallel agreement; the single-process default agrees with itself.
        write_policy: when nodes are offloaded (see above).
        write_through_threshold: hits before a ``write_through_selective`` offload.
        max_inflight_bytes: offload bytes in flight; past it offloads are dropped, counted.
        load_timeout_s: default per-request load deadline (slots are freed when the worker
            returns, never before).
        revalidate_after_s: a stored mark older than this is re-checked on the next hit.
        num_threads: store transfer threads.
        breaker: the lookup budget and circuit breaker for store calls on the caller's thread.
        max_lookups, max_lookup_bytes, lookup_ttl_s: bounds on remembered lookups.
        max_known_pages: store keys remembered as stored after their nodes left the device,
            so a prefix inserted again is not written again (0: off).
    """

    def __init__(
        self,
        cache: Any,
        store: Store | str,
        *,
        ranks: RankGroup | None = None,
        write_policy: WritePolicy | str = WritePolicy.WRITE_THROUGH,
        write_through_threshold: int = 2,
        max_inflight_bytes: int = 256 << 20,
        load_timeout_s: float = 30.0,
        revalidate_after_s: float = 300.0,
        num_threads: int = 2,
        breaker: BreakerConfig | None = None,
        max_lookups: int = 1 << 16,
        max_lookup_bytes: int = 64 << 20,
        lookup_ttl_s: float = 60.0,
        max_known_pages: int = 1 << 18,
    ):
        if not load_timeout_s > 0:
            raise ValueError(f"load_timeout_s must be positive, got {load_timeout_s!r}")
        self._owns_store = isinstance(store, str)
        self.store: Store = open_store(store) if isinstance(store, str) else store
        self.cache = cache
        self.ranks = ranks or LocalRankGroup()
        self.page_size: int = cache.page_size
        self.load_timeout_s = load_timeout_s
        self.metrics = LinkerStats()
        self._stats = self.metrics.counters
        self.guard = StoreGuard(self.store, CircuitBreaker(breaker))
        self.arena = StagingArena(pinned=cache.device.type == "cuda",
                                  max_cached_bytes=min(max_inflight_bytes, 256 << 20))
        self._worker = TransferWorker(self.store, num_threads, self.arena)
        self.page_hashes = PageHashMemo(self.page_size)
        self._progress: dict[int, LayerProgress] = {}  # load job -> its landing progress
        # NOTE: with several ranks an age bound would drop a lookup on one rank only.
        ttl = lookup_ttl_s if self.ranks.world_size == 1 else None
        self._lookups = RememberedLookups(max_lookups, max_lookup_bytes, ttl)
        self._loads = LoadTable()
        self._pending: set[int] = set()  # job ids submitted, completion not applied yet
        self._done: dict[int, Completion] = {}  # completions not applied yet, arrival order
        self._closed = False
        self.offload = OffloadPolicy(
            self,
            write_policy=write_policy,
            threshold=write_through_threshold,
            max_inflight_bytes=max_inflight_bytes,
            revalidate_after_s=revalidate_after_s,
            max_known_pages=max_known_pages,
        )
        self.keyspace = StoreKeys(self.ranks.rank, self.offload.replicated)
        cache.attach_linker(self)

    # ---------------------------------------------------------------- keys

    def store_keys(self, transfer: PoolTransfer, namespace: Any = None) -> list[str]:
        """Store keys of a transfer's pages: version / namespace / hash / pool [/ rank], in the
        resolved ``namespace`` (``cache.resolve_namespace``)."""
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
            ValueError: ``req_id`` already has a load in flight or an outcome not yet taken.
        """
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
        limit = self.load_timeout_s if timeout_s is None else timeout_s
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
        """Where the load of ``req_id`` is landing, while it is in flight: the full-pool slots
        of its whole prefix (device prefix + reserved slots being written) and a per-layer
        wait. An engine may run its forward on these slots, waiting for layer ``i`` before
        reading it, then must take the outcome (``wait_load`` / ``poll``) before using the
        prefix further: the outcome's slots are the canonical ones (the reserved slots may be
        duplicates the publish frees). Asking makes the load land layer by layer (call it
        right after ``load``); otherwise each pool lands in one copy. None when ``req_id`` has
        no load in flight."""
        member = self._loads.member(req_id)
        if member is None or member.transfer is None:
            return None
        reservation = member.transfer.reservation
        progress = self._progress.get(member.transfer.job_id)
        full = reservation.full
        if progress is None or full is None or full.device_indices is None:
            return None
        lookup = reservation.lookup
        progress.watch()
        return Landing(req_id=req_id, prefix_len=len(lookup.tokens),
                       loaded_len=len(lookup.tokens) - lookup.prefix_len,
                       device_indices=torch.cat([reservation.device_slots, full.device_indices]),
                       progress=progress)

    def cancel(self, req_id: Any) -> bool:
        """The request went away: forget its lookup, leave its queued load (the transfer is
        cancelled when no other request waits on it; its slots are freed when the worker
        returns) and release an outcome it never took. Returns whether anything was held.
        With several ranks, call it on every rank."""
        found = self._lookups.drop(req_id)
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
        self._process(self._worker.drain())
        self._expire()
        return self._loads.take_all()

    def wait_load(self, req_id: Any, timeout: float | None = None) -> LoadOutcome:
        """Block until the load of ``req_id`` finishes or its deadline passes, and return its
        outcome (a timeout fails this request only; others sharing the transfer go on).

        Args:
            timeout: shortens this request's deadline to ``now + timeout`` (never extends it).

        Raises:
            ValueError: no load was started for ``req_id`` (or its outcome was already taken).
        """
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
            self._process(self._worker.drain(block_for=min(max(left, 0.0), 0.05)))
            self._expire()
            outcome = self._loads.take(req_id)
            if outcome is not None:
                return outcome

    def _process(self, completions: list[Completion]) -> None:
        """Apply finished transfers as they arrive; with several ranks, exactly those finished
        on every rank (an agreed mask over the pending jobs), in job order."""
        for done in completions:
            self._done[done.job_id] = done
        if self.ranks.world_size == 1:
            ready = list(self._done)
        else:
            if not self._pending:  # NOTE: the same on every rank, so no collective is skipped
                return
            pending = sorted(self._pending)
            agreed = self.ranks.all_reduce_min([int(j in self._done) for j in pending])
            ready = [job for job, bit in zip(pending, agreed) if bit]
        for job_id in ready:
            done = self._done.pop(job_id)
            self._pending.discard(job_id)
            self.metrics.observe(done)
            transfer = self._loads.finish(job_id)
            if transfer is not None:
                self._finish_load(transfer, done)
            else:
                self.offload.finish(done)

    def _expire(self) -> None:
        """Members past their own deadline fail now (agreed across ranks); the transfer goes
        on for the others."""
        waiting = self._loads.waiting()
        if not waiting:
            return
        now = time.monotonic()
        late = [now >= member.deadline for member in waiting]
        if self.ranks.world_size > 1:
            late = [not ok for ok in self.ranks.all_reduce_min([0 if x else 1 for x in late])]
        for member, expired in zip(waiting, late):
            if expired:
                self._leave(member)
                self._stats["failures_timeout"] += 1
                self._deliver_failure(member, "timeout")

    def _leave(self, member: Member) -> None:
        transfer = self._loads.leave(member)
        if transfer is not None:  # its last member left: stop the job; ABORT on completion
            self._worker.cancel(transfer.job_id)
            self._stats["cancelled_transfers"] += 1

    def _finish_load(self, transfer: Transfer, done: Completion) -> None:
        reservation = transfer.reservation
        self._progress.pop(transfer.job_id, None)
        ok = done.ok and not transfer.cancelled and not self._closed
        ok = self.ranks.all_ok(ok)
        if done.status is TransferStatus.CORRUPT:
            self._stats["checksum_misses"] += 1
        reason = "" if ok else (
            (done.detail or done.status.value) if not done.ok else
            "cancelled" if transfer.cancelled else "closed" if self._closed else
            "another rank failed")
        if ok:
            lookup = reservation.lookup
            self.page_hashes.remember(lookup.namespace, lookup.tokens.tobytes(),
                                      lookup.prefix_len // self.page_size, lookup.keys)
            try:
                result = publish(self.cache, self.cache.components, reservation)
            except ValueError as exc:  # the insert refused before changing anything
                ok, reason = False, f"publish refused: {exc}"
                self._stats["failures_publish"] += 1
        if not ok:
            if reason != "cancelled":
                self._stats["failures_load"] += 1
            for member in transfer.members:
                self._deliver_failure(member, reason)
            release(self.cache, reservation)
            return
        self.offload.mark_loaded(result.last_node, reservation.prefix_len,
                                 reservation.transfers)
        self._stats["loaded_bytes"] += done.num_bytes
        self._stats["loaded_pages"] += reservation.lookup.num_pages
        self._deliver_success(transfer)
        self.cache.unlock(reservation.handle)

    def _deliver_success(self, transfer: Transfer) -> None:
        lookup = transfer.reservation.lookup
        match = self.cache.peek_prefix(lookup.tokens, namespace=lookup.namespace)
        loaded_len = max(0, match.prefix_len - lookup.prefix_len)
        for member in transfer.members:
            handle = self.cache.lock(match.last_node)
            self.cache.unlock(member.handle)
            self._stats["loaded_tokens"] += loaded_len  # the store tier's hits, per request
            self._put(LoadOutcome(
                req_id=member.req_id, ok=True, prefix_len=match.prefix_len,
                device_indices=match.device_indices, last_node=match.last_node, lock=handle,
                loaded_len=loaded_len, match=match,
            ))

    def _deliver_failure(self, member: Member, reason: str) -> None:
        self._put(LoadOutcome(
            req_id=member.req_id, ok=False, prefix_len=member.lookup.prefix_len,
            device_indices=member.device_slots, last_node=member.handle.node,
            lock=member.handle, reason=reason,
        ))

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
        self._process(self._worker.drain())

    def before_evict(self, node: Any) -> None:
        """The tree is about to free some of ``node``'s device data (``TreeObserver``)."""
        self.offload.before_evict(node)

    def on_split(self, parent: Any, child: Any) -> None:
        """The tree split ``child`` (``TreeObserver``)."""
        self.offload.on_split(parent, child)

    def submit(self, job: Job) -> int:
        """Queue a worker job whose completion this linker applies."""
        job_id = self._worker.submit(job)
        self._pending.add(job_id)
        return job_id

    def flush(self, timeout: float | None = None) -> bool:
        """Send queued offloads, wait for in-flight offloads (and loads) and apply their
        results; False on timeout."""
        self.offload.flush_batch()
        idle = self._worker.wait_idle(timeout)
        self._process(self._worker.drain())
        return idle

    def close(self) -> None:
        """Quiesce every transfer, ABORT loads not yet published, then release every lock the
        linker holds (in that order). Idempotent."""
        if self._closed:
            return
        self.offload.flush_batch()
        self._closed = True
        for transfer in self._loads.transfers():  # NOTE: aborted anyway; skip their writes
            self._worker.cancel(transfer.job_id)
        # NOTE: joins every queued and running transfer (a bounded wait would leave reserved
        # slots that a late worker write may still land in); then every completion is applied.
        self._worker.close()
        self._process(self._worker.drain())
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
