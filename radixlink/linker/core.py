"""``ExternalCacheLinker``: the facade an engine calls to link a ``UnifiedCache`` to a ``Store``
(DESIGN.md section 5b): LOOKUP and LOAD through the ``Loader``, OFFLOAD through the
``Offloader``, both built from one ``LinkerParts`` record.

Owns building the parts and the lifecycle (``flush``, ``close``, ``stats``); every method is
one of the engine's (or the cache's) calls and hands it to the loader or the offloader, which
never reach back to this facade. Store I/O runs on the transfer engine's threads; everything that
touches the tree runs on the caller's thread.
"""

from __future__ import annotations

from typing import Any

from radixlink.checks import check_namespaced, check_prefill, check_seconds
from radixlink.contract import InsertParams, MatchResult
from radixlink.cost import EstimateTracker
from radixlink.linker.config import LinkerConfig
from radixlink.linker.loader import Loader
from radixlink.linker.offload import Offloader
from radixlink.linker.outcomes import Landing, LoadOutcome
from radixlink.linker.parts import LinkerParts, build_parts
from radixlink.linker.ranks import LocalRankGroup, RankGroup
from radixlink.stores.base import Store
from radixlink.stores.registry import open_store


def _check_parts(store: Any, ranks: Any, cost_model: Any) -> None:
    """The linker's collaborators are of the kinds it calls, checked before anything opens."""
    if not isinstance(store, (str, Store)):
        raise ValueError(
            f"store must be a radixlink Store or a store URL (e.g. 'file:///path/to/dir', "
            f"'redis://host:6379/0', 'memory://'), got {type(store).__name__} {store!r:.60}"
        )
    if ranks is not None and not isinstance(ranks, RankGroup):
        raise ValueError(
            f"ranks must be a RankGroup (LocalRankGroup, or TorchRankGroup for tensor-parallel "
            f"ranks), got {type(ranks).__name__}"
        )
    if cost_model is not None and not isinstance(cost_model, EstimateTracker):
        raise ValueError(
            f"cost_model must be a radixlink.cost.EstimateTracker or None, got "
            f"{type(cost_model).__name__}"
        )


class ExternalCacheLinker:
    """Links a ``UnifiedCache`` to an external page store.

    Protocol for one request (the engine's thread)::

        m = cache.match_prefix(prompt, req_id=rid)   # device match + store LOOKUP
        if m.external_hit_len and linker.load(rid):  # PREPARE, transfer on an I/O thread
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
        ValueError: a bad option, or both ``config`` and options; a ``store``, ``ranks`` or
            ``cost_model`` of another kind; a store other processes
            reach (anything but ``memory://``) while the cache has no model namespace
            (``CacheConfig.namespace.model``).
    """

    def __init__(self, cache: Any, store: Store | str, *, ranks: RankGroup | None = None,
                 config: LinkerConfig | None = None, cost_model: EstimateTracker | None = None,
                 **options: Any):
        if config is not None and options:
            raise ValueError(f"pass either config= or options {sorted(options)}, not both")
        _check_parts(store, ranks, cost_model)
        self.config = config = config or LinkerConfig(**options)
        self._owns_store = isinstance(store, str)
        self.store: Store = open_store(store) if isinstance(store, str) else store
        check_namespaced(cache.config, self.store, close=self._owns_store)
        self.cache = cache
        self.ranks = ranks or LocalRankGroup()
        self.cost_model = cost_model
        self.parts: LinkerParts = build_parts(cache, self.store, self.ranks, config, cost_model)
        self.offload = Offloader(self.parts)
        self._loader = Loader(self.parts, self.offload)
        self._closed = False
        cache.attach_linker(self)
        self.parts.adopt_index()

    # ---------------------------------------------------------------- the cache's calls

    def lookup(self, result: MatchResult, key: bytes, req_id: Any, namespace: Any = None) -> None:
        """Fill ``result.external_hit_len`` for the device-uncached whole pages of ``key``
        (packed uint32 tokens, in the resolved ``namespace``) and remember what
        ``load(req_id)`` should fetch. Called by ``cache.match_prefix``; a failed, slow or
        skipped store is a miss (counted), never an exception. The tail's page hashes go down
        to the tree (``tree.hash_memo``) for the insert of the same tokens."""
        self._loader.lookup(result, key, req_id, namespace)

    def on_insert(self, params: InsertParams, result: Any) -> None:
        """Called by ``cache.insert``: count hits, start offloads by the write policy, and
        apply transfers that finished meanwhile."""
        self.offload.on_insert(params, result)
        self._loader.process()

    def before_evict(self, node: Any) -> None:
        """The tree is about to free some of ``node``'s device data (``TreeObserver``)."""
        self.offload.before_evict(node)

    # ---------------------------------------------------------------- the engine's calls

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
        return self._loader.load(req_id, timeout_s)

    def landing(self, req_id: Any) -> Landing | None:
        """Where the in-flight load of ``req_id`` is landing (``outcomes.landing``): the slots
        of its whole prefix and a per-layer wait, for a forward that starts before the load
        ends; then take the outcome before using the prefix further (its slots are the
        canonical ones). Asking makes the load land layer by layer: call it right after
        ``load``. None when ``req_id`` has no load in flight."""
        return self._loader.landing(req_id)

    def cancel(self, req_id: Any) -> bool:
        """The request went away: forget its lookup, leave its queued load (the transfer is
        cancelled when no other request waits on it; its slots are freed when the worker
        returns) and release an outcome it never took. Returns whether anything was held.
        With several ranks, call it on every rank."""
        return self._loader.cancel(req_id)

    def poll(self) -> list[LoadOutcome]:
        """Finished loads (and finished offloads' bookkeeping) since the last call. Also sends
        the offloads queued since the last call as one batch: call it once per engine step."""
        if self.offload.batch is not None:
            self.offload.flush_batch()
        return self._loader.poll()

    def wait_load(self, req_id: Any, timeout: float | None = None) -> LoadOutcome:
        """Block until the load of ``req_id`` finishes or its deadline passes, and return its
        outcome (a timeout fails this request only; others sharing the transfer go on).

        Args:
            timeout: shortens this request's deadline to ``now + timeout`` (never extends it).

        Raises:
            ValueError: no load was started for ``req_id`` (or its outcome was already taken);
                an unhashable ``req_id`` or a ``timeout`` that is not a number >= 0.
        """
        if self.offload.batch is not None:
            self.offload.flush_batch()
        return self._loader.wait(req_id, timeout)

    def observe_prefill(self, num_new: int, num_cached: int, seconds: float) -> None:
        """The engine computed ``num_new`` tokens after ``num_cached`` in ``seconds``: feeds
        the cost model's prefill estimate (a no-op without a cost model).

        Raises:
            ValueError: as ``check_prefill``: bad counts or seconds.
        """
        check_prefill(num_new, num_cached, seconds)
        if self.cost_model is not None:
            self.cost_model.observe_prefill(num_new, num_cached, seconds)

    # ---------------------------------------------------------------- lifecycle

    def flush(self, timeout: float | None = None) -> bool:
        """Send queued offloads, wait for in-flight offloads (and loads) and apply their
        results; False on timeout (with several ranks: on any rank, so every rank answers
        alike; call it on every rank)."""
        if timeout is not None:
            check_seconds("flush(timeout=)", timeout, allow_zero=True)
        self.offload.flush_batch()
        idle = self.parts.engine.wait_idle(timeout)
        self._loader.process()
        # NOTE: a rank still busy leaves its jobs unapplied on every rank: agreed, True means
        # everything was applied everywhere
        return idle if self.parts.world_size == 1 else self.ranks.all_ok(idle)

    def close(self) -> None:
        """Quiesce transfers within the engine's ``CLOSE_BUDGET_S`` (then cancel queued ones,
        leave running offloads; running loads are always waited for, so no late write lands in
        freed slots), ABORT loads not yet published, release every lock the linker holds.
        Idempotent."""
        if self._closed:
            return
        self.offload.flush_batch()
        self._closed = True
        self._loader.close()
        self.parts.engine.close()
        self._loader.process()
        self.offload.abandon()  # offloads still running: their pages are not recorded stored
        self._loader.release_outcomes()
        self.parts.guard.close()
        self.cache.detach_linker(self)
        if self._owns_store:
            self.store.close()

    def stats(self) -> dict[str, Any]:
        """Counters: lookups, hit pages, loads, loaded pages/tokens/bytes, offloads, offloaded
        pages/bytes, dropped offloads, cancellations, failures by phase, checksum misses; the
        store breaker's state; remembered lookups; the stored index's size; and the
        ``load_seconds`` / ``offload_seconds`` histogram snapshots."""
        parts = self.parts
        gauges = {**self._loader.gauges(), **parts.guard.stats()}
        gauges["pending_transfers"] = parts.engine.pending
        gauges.update(parts.arena.stats())
        return parts.metrics.snapshot(self.offload.stats(), **gauges)

    def __enter__(self) -> ExternalCacheLinker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
