"""``ExternalCacheLinker``: LOOKUP, LOAD (prepare, transfer, verify, publish, commit or abort)
and OFFLOAD between a ``UnifiedCache`` and a ``Store`` (DESIGN.md section 5b).

Owns the load/offload lifecycle, completion processing and counters. Reaches the tree only
through the cache's public facade and the components' linker hooks; store I/O runs on the
worker's threads, everything that touches the tree runs on the caller's thread.
"""

from __future__ import annotations

import time
from typing import Any

from radixlink.contract import InsertParams, MatchResult, PoolTransfer
from radixlink.hashing import namespace_id
from radixlink.linker.lookup import find_restorable
from radixlink.linker.offload import OffloadPolicy
from radixlink.linker.phases import abort, prepare, publish
from radixlink.linker.ranks import LocalRankGroup, RankGroup
from radixlink.linker.records import Load, LoadOutcome, Lookup, pool_writer
from radixlink.linker.stats import LinkerStats, quiet_matches
from radixlink.linker.worker import Completion, PoolPages, TransferStatus, TransferWorker
from radixlink.stores.base import Store
from radixlink.stores.keys import page_key
from radixlink.stores.registry import open_store

MAX_LOOKUPS = 1 << 16  # remembered lookups not yet loaded; the oldest go first past this


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

    Offloads start by themselves after inserts, by ``write_policy``: ``write_through``
    (a node's first hit, its creating insert included), ``write_through_selective`` (its
    ``write_through_threshold``-th hit) or ``write_back`` (just before eviction frees it).

    Args:
        cache: the cache (built with ``enable_external_cache_linker=True``).
        store: a ``Store`` or a store URL (the linker then owns and closes it).
        ranks: tensor-parallel agreement; the single-process default agrees with itself.
        write_policy: when nodes are offloaded (see above).
        write_through_threshold: hits before a ``write_through_selective`` offload.
        max_inflight_bytes: offload bytes in flight; past it offloads are dropped, counted.
        load_timeout_s: a load not finished by then fails (its slots are freed when the
            worker returns, never before).
        revalidate_after_s: a stored mark older than this is re-checked on the next hit.
        num_threads: store transfer threads.
    """

    def __init__(
        self,
        cache: Any,
        store: Store | str,
        *,
        ranks: RankGroup | None = None,
        write_policy: str = "write_through",
        write_through_threshold: int = 2,
        max_inflight_bytes: int = 256 << 20,
        load_timeout_s: float = 30.0,
        revalidate_after_s: float = 300.0,
        num_threads: int = 2,
    ):
        self._owns_store = isinstance(store, str)
        self.store: Store = open_store(store) if isinstance(store, str) else store
        self.cache = cache
        self.ranks = ranks or LocalRankGroup()
        self.page_size: int = cache.page_size
        self.load_timeout_s = load_timeout_s
        self.metrics = LinkerStats()
        self._stats = self.metrics.counters
        self._worker = TransferWorker(self.store, num_threads)
        self._lookups: dict[Any, Lookup] = {}
        self._loads: dict[int, Load] = {}  # job id -> leader load
        self._by_req: dict[Any, Load] = {}
        self._by_signature: dict[tuple[str, int], Load] = {}
        self._ready: dict[Any, LoadOutcome] = {}
        self._completions: dict[int, Completion] = {}
        self._submitted: list[int] = []  # job ids not yet applied, in submission order
        self._publishing = False
        self._applying = False
        self._closed = False
        self.offload = OffloadPolicy(
            self,
            write_policy=write_policy,
            threshold=write_through_threshold,
            max_inflight_bytes=max_inflight_bytes,
            revalidate_after_s=revalidate_after_s,
        )
        cache.attach_linker(self)

    # ---------------------------------------------------------------- keys

    def store_keys(self, transfer: PoolTransfer, namespace: Any = None) -> list[str]:
        """Store keys of a transfer's pages: version / namespace / hash / pool [/ rank]."""
        ns_id = namespace_id(self._namespace(namespace))
        rank = None if self.offload.replicated(transfer.name) else self.ranks.rank
        return [page_key(ns_id, h, transfer.name, rank) for h in transfer.keys]

    def _namespace(self, namespace: Any) -> Any:
        return self.cache.config.namespace if namespace is None else namespace

    # ---------------------------------------------------------------- LOOKUP

    def lookup(self, result: MatchResult, key: bytes, req_id: Any, namespace: Any = None) -> None:
        """Fill ``result.external_hit_len`` for the device-uncached whole pages of ``key``
        (packed uint32 tokens) and remember what ``load(req_id)`` should fetch.

        Called by ``cache.match_prefix``. A store error is a miss (counted).
        """
        self._lookups.pop(req_id, None)
        found = find_restorable(self, result, key, namespace)
        self._stats["lookups"] += 1
        result.external_hit_len = 0 if found is None else found.num_pages * self.page_size
        if found is not None:
            self._stats["lookup_hit_pages"] += found.num_pages
            if len(self._lookups) >= MAX_LOOKUPS:  # NOTE: engines may look up and never load
                del self._lookups[next(iter(self._lookups))]
                self._stats["lookups_dropped"] += 1
            self._lookups[req_id] = found

    @property
    def _components(self) -> tuple[Any, ...]:
        return tuple(self.cache.components)

    # ---------------------------------------------------------------- LOAD

    def load(self, req_id: Any) -> bool:
        """Start the load that ``match_prefix(..., req_id=req_id)`` found.

        Reserves device slots (PREPARE) and queues the transfer; identical in-flight loads
        share one transfer. Returns False (nothing held) when there is nothing to load or no
        room; then the caller proceeds with its device prefix.
        """
        lookup = self._lookups.pop(req_id, None)
        if lookup is None or self._closed:
            return False
        if req_id in self._by_req:
            raise ValueError(f"request {req_id!r} already has a load in flight; wait for it")
        try:
            handle = self.cache.lock(lookup.last_node)
        except ValueError:  # the device prefix was evicted since the match
            return False
        load = Load(req_id=req_id, lookup=lookup, handle=handle, started=time.monotonic())
        leader = self._by_signature.get(lookup.signature)
        if leader is not None and leader.lookup.prefix_len == lookup.prefix_len:
            load.leader = leader
            leader.followers.append(load)
            self._by_req[req_id] = load
            self._stats["shared_loads"] += 1
            return True
        prepared = prepare(self._components, load)
        agreed = self.ranks.all_ok(prepared)  # NOTE: one rank short of room fails it on all
        if prepared and not agreed:
            abort(self._components, load)
        if not agreed:
            self.cache.unlock(handle)
            self._stats["failures_prepare"] += 1
            return False
        pools = [
            PoolPages(keys=self.store_keys(t, lookup.namespace), codec=self.offload.codec(t.name),
                      write=pool_writer(self.cache.pool(t.name), t))
            for t in load.transfers if t is not None
        ]
        load.job_id = self._worker.submit_load(pools)
        self._submitted.append(load.job_id)
        self._loads[load.job_id] = load
        self._by_req[req_id] = load
        self._by_signature[lookup.signature] = load
        self._stats["loads_started"] += 1
        return True

    # ---------------------------------------------------------------- completions

    def poll(self) -> list[LoadOutcome]:
        """Finished loads (and finished offloads' bookkeeping) since the last call."""
        self._process(self._worker.drain())
        self._expire()
        return self._take_ready()

    def wait_load(self, req_id: Any, timeout: float | None = None) -> LoadOutcome:
        """Block until the load of ``req_id`` finishes (or times out) and return its outcome.

        Raises:
            ValueError: no load was started for ``req_id`` (or its outcome was already taken).
        """
        if req_id not in self._by_req and req_id not in self._ready:
            raise ValueError(f"no load in flight for request {req_id!r}; call load() first")
        limit = self.load_timeout_s if timeout is None else min(timeout, self.load_timeout_s)
        deadline = time.monotonic() + limit
        while req_id not in self._ready:
            left = deadline - time.monotonic()
            if self._agree_expired([left <= 0])[0]:
                self._fail_late(self._by_req[req_id])
                break
            self._process(self._worker.drain(block_for=min(max(left, 0.0), 0.05)))
        outcome = self._ready.pop(req_id)
        return outcome

    def _take_ready(self) -> list[LoadOutcome]:
        out = list(self._ready.values())
        self._ready.clear()
        return out

    def _process(self, completions: list[Completion]) -> None:
        """Apply completions strictly in submission order, as many as every rank has, so all
        ranks apply (and agree on) the same ones in the same sequence."""
        for done in completions:
            self._completions[done.job_id] = done
        if self._applying:  # NOTE: re-entered through a publish's insert; the outer loop applies
            return
        self._applying = True
        try:
            ready = 0
            while ready < len(self._submitted) and self._submitted[ready] in self._completions:
                ready += 1
            if self.ranks.world_size > 1:  # NOTE: completions arrive at different times per
                ready = self.ranks.agree_count(ready)  # rank; apply (and agree on) the same ones
            for _ in range(ready):
                job_id = self._submitted.pop(0)
                done = self._completions.pop(job_id)
                self.metrics.observe(done)
                if done.kind == "load":
                    self._finish_load(self._loads.pop(job_id), done)
                else:
                    self.offload.finish(done)
        finally:
            self._applying = False

    def _expire(self) -> None:
        now = time.monotonic()
        loads = [load for load in self._by_req.values() if not load.delivered]
        if not loads:
            return
        late = self._agree_expired([now - load.started > self.load_timeout_s for load in loads])
        for load, expired in zip(loads, late):
            if expired:
                self._fail_late(load)

    def _agree_expired(self, expired: list[bool]) -> list[bool]:
        """A deadline passed on any rank passed on all (a collective with several ranks)."""
        if self.ranks.world_size == 1:
            return expired
        return [not ok for ok in self.ranks.all_reduce_min([0 if e else 1 for e in expired])]

    def _fail_late(self, load: Load) -> None:
        """The load ran past its timeout: the caller gets a failed outcome now; the reserved
        slots stay held until the worker returns (its completion ABORTs them)."""
        leader = load.leader or load
        if leader.job_id is not None and not leader.timed_out:
            leader.timed_out = True
            self._worker.cancel(leader.job_id)
            self._forget_signature(leader)  # later requests must not join a doomed transfer
            self._stats["failures_timeout"] += 1
        for member in [leader, *leader.followers]:
            self._deliver_failure(member, "timeout")

    def _finish_load(self, load: Load, done: Completion) -> None:
        ok = self.ranks.all_ok(done.ok and not load.timed_out and not self._closed)
        if done.status is TransferStatus.CORRUPT:
            self._stats["checksum_misses"] += 1
        if not ok:
            self._stats["failures_load"] += 1
            abort(self._components, load)
            self._forget_signature(load)
            reason = (done.detail or done.status.value) if not done.ok else (
                "timeout" if load.timed_out else "closed" if self._closed else
                "another rank failed")
            for member in [load, *load.followers]:
                self._deliver_failure(member, reason)
            return
        self._publish(load)
        self._stats["loaded_bytes"] += done.num_bytes
        self._stats["loaded_pages"] += load.lookup.num_pages
        self._forget_signature(load)
        for member in [load, *load.followers]:
            self._deliver_success(member)

    def _forget_signature(self, load: Load) -> None:
        if self._by_signature.get(load.lookup.signature) is load:
            del self._by_signature[load.lookup.signature]

    def _publish(self, load: Load) -> None:
        """Insert the verified pages (tracking adoption), then COMMIT every component."""
        self._publishing = True  # NOTE: the publishing insert is not a hit and offloads nothing
        try:
            with quiet_matches(self.cache):
                result = publish(self.cache, self._components, load)
        finally:
            self._publishing = False
        self.offload.mark_loaded(result.last_node, load.lookup.prefix_len)

    def _deliver_success(self, load: Load) -> None:
        lookup = load.lookup
        with quiet_matches(self.cache):
            match = self.cache.match_prefix(lookup.tokens, namespace=lookup.namespace)
        handle = self.cache.lock(match.last_node)
        self.cache.unlock(load.handle)
        loaded_len = max(0, match.prefix_len - lookup.prefix_len)
        self._stats["loaded_tokens"] += loaded_len  # the store tier's hits, per request
        self._finish(load, LoadOutcome(
            req_id=load.req_id, ok=True, prefix_len=match.prefix_len,
            device_indices=match.device_indices, last_node=match.last_node, lock=handle,
            loaded_len=loaded_len, match=match,
        ))

    def _deliver_failure(self, load: Load, reason: str) -> None:
        if load.delivered:
            return
        lookup = load.lookup
        with quiet_matches(self.cache):
            match = self.cache.match_prefix(lookup.tokens[: lookup.prefix_len],
                                            namespace=lookup.namespace)
        if match.mamba_slot is not None:
            self.cache.free_state(match.mamba_slot)
        self._finish(load, LoadOutcome(
            req_id=load.req_id, ok=False, prefix_len=match.prefix_len,
            device_indices=match.device_indices, last_node=load.handle.node, lock=load.handle,
            reason=reason,
        ))

    def _finish(self, load: Load, outcome: LoadOutcome) -> None:
        load.delivered = True
        self._by_req.pop(load.req_id, None)
        if self._closed:
            self.cache.unlock(outcome.lock)
            if outcome.match is not None and outcome.match.mamba_slot is not None:
                self.cache.free_state(outcome.match.mamba_slot)
            return
        self._ready[load.req_id] = outcome

    # ---------------------------------------------------------------- insert hook, lifecycle

    def on_insert(self, params: InsertParams, result: Any) -> None:
        """Called by ``cache.insert``: count hits and start offloads by the write policy."""
        if not self._publishing:
            self.offload.on_insert(params, result)
        self._process(self._worker.drain())

    def before_evict(self, node: Any) -> None:
        """Called by the cache just before eviction frees ``node``'s device data."""
        self.offload.before_evict(node)

    def submit_offload(self, pools: list[PoolPages]) -> int:
        job_id = self._worker.submit_offload(pools)
        self._submitted.append(job_id)
        return job_id

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for in-flight offloads (and loads) and apply their results; False on timeout."""
        idle = self._worker.wait_idle(timeout)
        self._process(self._worker.drain())
        return idle

    def close(self) -> None:
        """Quiesce every transfer, ABORT loads not yet published, then release every lock the
        linker holds (in that order). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for job_id in self._loads:  # NOTE: they are aborted anyway; skip their pool writes
            self._worker.cancel(job_id)
        # NOTE: joins every queued and running transfer (a bounded wait would leave reserved
        # slots that a late worker write may still land in); then every completion is applied.
        self._worker.close()
        self._process(self._worker.drain())
        for load in list(self._by_req.values()):
            self._deliver_failure(load, "closed")
        for outcome in self._take_ready():
            self.cache.unlock(outcome.lock)
            if outcome.match is not None and outcome.match.mamba_slot is not None:
                self.cache.free_state(outcome.match.mamba_slot)
        self.cache.detach_linker(self)
        if self._owns_store:
            self.store.close()

    def stats(self) -> dict[str, Any]:
        """Counters: lookups, hit pages, loads, loaded pages/tokens/bytes, offloads, offloaded
        pages/bytes, dropped offloads, failures by phase, checksum misses; and the
        ``load_seconds`` / ``offload_seconds`` histogram snapshots."""
        return self.metrics.snapshot(self.offload.stats(), loads_in_flight=len(self._loads),
                                     pending_transfers=self._worker.pending)

    def count(self, name: str, n: int = 1) -> None:
        self._stats[name] += n
