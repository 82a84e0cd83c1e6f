"""``RadixlinkLinker``: radixlink stores behind SGLang's unified cache external linker.

Owns the ``UnifiedCacheLinker`` contract (lookup, queued layer-wise loads, in-order offloads);
its transfers run on one ``pages.engine.TransferEngine`` per linker. SGLang's own wrapper
(``UnifiedCacheLinkerWrapper``) keeps the tree side: hashing, rank agreement, slot
reservation, publishing. Must not touch SGLang's tree; imports SGLang.

Launch (docs/integrations.md)::

    --enable-unified-cache-external-linker --unified-cache-external-linker-backend dynamic
    --unified-cache-external-linker-config '{"linker": "RadixlinkLinker",
        "linker_module_path": "radixlink.integrations.sglang.linker",
        "linker_extra_config": {"store": "redis://127.0.0.1:6379/0"}}'
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import PoolName as SGLangPoolName
from sglang.srt.mem_cache.hicache_storage import PoolTransfer
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.unified_cache_linker import UnifiedCacheLinker

try:
    from sglang.srt.mem_cache.unified_cache.unified_cache_linker import LayerWiseLoadCounter

    from radixlink.integrations.sglang.load_counter import TimedLoadCounter
except ImportError:  # NOTE: SGLang's PR #40595 revision has none (see REFUSED_REVISION)
    LayerWiseLoadCounter = TimedLoadCounter = None

from radixlink.contract import PoolHitPolicy, PoolName
from radixlink.integrations.sglang.device_pools import DevicePools, build_device_pools
from radixlink.integrations.sglang.guard import (
    empty_list,
    false,
    never_raises,
    nothing,
    zero,
)
from radixlink.integrations.sglang.keyspace import KeySpace
from radixlink.integrations.sglang.settings import parse_settings
from radixlink.integrations.sglang.workers import (
    InOrder,
    LoadBatches,
    PageMove,
    load_job,
    log_load,
    offload_job,
)
from radixlink.pages import pageio
from radixlink.pages.engine import Completion, TransferEngine
from radixlink.pages.restore import PoolRule, restorable, stored_past
from radixlink.pages.staging import StagingArena
from radixlink.stores.base import Store
from radixlink.stores.registry import open_reachable_store

logger = logging.getLogger(__name__)

_POOLS = {pool.value: pool for pool in PoolName}
IO_THREADS = 2
"""The engine's I/O threads: a load batch need not wait for an offload running before it."""
REFUSED_REVISION = (
    "radixlink linker: this SGLang's unified cache linker contract has no "
    "LayerWiseLoadCounter (the revision of SGLang PR #40595, whose loads complete through "
    "pop_completed_load with no failure verdict); radixlink verifies every page and must be "
    "able to fail a load, so it supports SGLang 0.5.23's contract only (see "
    "docs/integrations.md); use the HiCache backend (RadixlinkHiCacheStorage) instead"
)


class RadixlinkLinker(UnifiedCacheLinker):
    """SGLang's device pools linked to one radixlink store (FULL, SWA and MAMBA pools).

    Pages are keyed by SGLang's own storage hashes (request namespace included) under a
    store namespace of (``namespace``, pool layouts, pipeline stage); non-replicated pools add
    the tensor-parallel rank. Each page is encoded by radixlink's codec (layout fingerprint,
    store-key digest, checksum, optional seal), so a corrupt, foreign or misplaced page
    is a miss.

    Args:
        server_args: SGLang's ``ServerArgs`` (``model_path`` is the default namespace).
        params: SGLang's ``CacheInitParams`` (pools, allocator, TP group, PP rank).
        components: the cache's ``ComponentType`` set.
        extra_config: ``linker_extra_config``: ``store``, ``namespace``, ``checksum``.
        forward_stream: the stream the forward writes the device pools on (CUDA), or None.

    Raises:
        ValueError: a bad config key or value, a pool kind the linker cannot move, or an
            SGLang whose linker contract has no ``LayerWiseLoadCounter`` (``REFUSED_REVISION``).
        StoreError: the store is unreachable at startup (one presence check).

    After construction no method raises into SGLang (``guard.never_raises``).
    """

    def __init__(
        self,
        server_args: Any,
        params: Any,
        *,
        components: set[ComponentType],
        extra_config: dict[str, Any] | None = None,
        forward_stream: Any = None,
    ) -> None:
        if LayerWiseLoadCounter is None or TimedLoadCounter is None:
            raise ValueError(REFUSED_REVISION)
        self.forward_stream = forward_stream
        settings = parse_settings(
            extra_config,
            model_name=getattr(server_args, "model_path", None),
            passthrough=frozenset(),
        )
        kvcache = params.token_to_kv_pool_allocator.get_kvcache()
        self._device_pools: DevicePools = build_device_pools(
            kvcache, params.req_to_token_pool, ComponentType.MAMBA in components
        )
        tp_rank, tp_size = _tp_rank_and_size(params)
        layout = (
            f"{self._device_pools.fingerprint}|tp={tp_size}|pp={params.pp_rank}/{params.pp_size}"
        )
        views = self._device_pools.pools
        self._keys = KeySpace.create(
            namespace=settings.namespace,
            layout=layout,
            rank=tp_rank,
            replicated=frozenset(name for name, view in views.items() if view.replicated),
        )
        self._store = open_reachable_store(settings.store)
        secret = self._store.page_secret
        self._codecs = {
            name: pageio.make_codec(view.fingerprint, view.page_bytes, secret=secret,
                                    checksum=settings.checksum)
            for name, view in views.items()
        }
        self.pools: dict[SGLangPoolName, object] = {
            SGLangPoolName(name.value): view for name, view in views.items()
        }
        self.layer_done_counter = TimedLoadCounter(self._device_pools.num_layers)
        if PoolName.MAMBA in views:
            # NOTE: Mamba states are read through the request pool, which waits on its own
            # counter; the KV pool's counter is registered by SGLang's cache factory.
            params.req_to_token_pool.register_layer_transfer_counter(self.layer_done_counter)
        self._device = next(iter(views.values())).device
        self._engine = TransferEngine(
            self._store, IO_THREADS, StagingArena(pinned=self._device.type == "cuda"),
            name="radixlink-sglang",
        )
        if self._device.type == "cpu":  # NOTE: loads stream through it (workers.load_job)
            self._engine.reserve_stream(list(self._codecs.values()))
        self._batches = LoadBatches()
        self._offloads = InOrder()
        # NOTE: stored pages a lookup found past its restore point (never read, so never
        # verified); an offload holding one is written whole, never skipped as stored.
        self._unread = pageio.BadKeys()
        self._pending: dict[str, list[PageMove]] = {}
        self._closed = False
        logger.info(
            "radixlink linker: store=%s pools=%s layers=%d rank=%d/%d namespace=%s",
            type(self._store).__name__, sorted(p.value for p in views),
            self._device_pools.num_layers, tp_rank, tp_size, self._keys.namespace_id,
        )

    @property
    def store(self) -> Store:
        """The store this linker reads and writes (owned: closed by ``close``)."""
        return self._store

    @never_raises(empty_list)
    def lookup(self, rid: str, transfers: list[PoolTransfer]) -> list[int]:
        """Every restorable prefix length (pages of the tail) on this rank, from one batched
        presence check; a store failure is "nothing restorable". Pages that failed
        verification in an earlier load were deleted, and count as absent until written
        again even if the delete failed (``pageio.BadKeys``). Pages stored past the longest
        restorable length are never read, so the offload that holds one rewrites it (heal
        in one pass: one may be damaged behind the missing page)."""
        kv = next((t for t in transfers if t.name == SGLangPoolName.KV), None)
        if kv is None or not kv.keys:
            return []
        hashes = list(kv.keys)
        rules: list[PoolRule] = []
        keys: list[str] = []
        for transfer in transfers:
            pool = self._known_pool(transfer)
            if pool is None or transfer.hit_policy.value not in ("all_pages", "trailing_pages"):
                return []
            policy = PoolHitPolicy(transfer.hit_policy.value)
            window = len(transfer.keys or ()) if policy is PoolHitPolicy.TRAILING_PAGES else 0
            if policy is PoolHitPolicy.TRAILING_PAGES and window < 1:
                return []
            rules.append(PoolRule(pool, policy, window))
            keys += self._keys.keys(hashes, pool)  # NOTE: presence at every tail page
        present = pageio.present(self._store, keys, self._engine.bad)
        lengths = restorable(rules, present, len(hashes))
        past = stored_past(present, len(hashes), max(lengths, default=0))
        self._unread.add([keys[i] for i in past])
        return lengths

    @never_raises(false)
    def load(self, rid: str, transfers: list[PoolTransfer]) -> bool:
        """Queue ``rid``'s pages for the next ``start_layer_wise_loading``; False (nothing
        queued) for a transfer the linker cannot serve or a request already queued."""
        if rid in self._pending:
            logger.warning("radixlink load for %s is already queued", rid)
            return False
        moves: list[PageMove] = []
        for transfer in transfers:
            pool = self._known_pool(transfer)
            if pool is None or not transfer.keys or transfer.device_indices is None:
                return False
            view = self._device_pools.pools[pool]
            if transfer.device_indices.numel() != len(transfer.keys) * view.rows_per_page:
                logger.warning(
                    "radixlink load for %s: %d %s slots for %d pages", rid,
                    transfer.device_indices.numel(), pool.value, len(transfer.keys),
                )
                return False
            moves.append(self._move(pool, transfer))
        if not moves:
            return False
        self._pending[rid] = moves
        return True

    @never_raises(lambda *_, **__: -1)
    def start_layer_wise_loading(self) -> int:
        """Start every queued load as one batch; its counter index, or -1 when none is queued.
        A batch that cannot start fails through its counter (its requests are aborted)."""
        if not self._pending:
            return -1
        pending, self._pending = self._pending, {}
        moves = [move for request in pending.values() for move in request]
        index = self.layer_done_counter.update_producer()
        self._batches.started(index, list(pending))
        try:
            ready: list[Any] = []
            if self._device.type == "cuda":
                ready.append(torch.cuda.Event())
                ready[0].record()  # the slots' previous users are done on the scheduler's stream
            job, landing = load_job(self._engine.arena, index, moves, self.layer_done_counter,
                                    self._device_pools.num_layers, self._sync, ready,
                                    lambda done: self._load_ended(index, moves, done, landing))
            self._engine.submit(job)
        except Exception as exc:  # noqa: BLE001 - reported as this batch's failure
            logger.warning("radixlink load batch %d could not start: %s", index, exc)
            self.layer_done_counter.fail(index, exc)
            self._batches.ended(index)
        return index

    @never_raises(false)
    def finish_layer_wise_loading(self, counter_index: int) -> bool:
        """Wait until batch ``counter_index`` stops writing; True when every layer landed."""
        if counter_index < 0:
            return True
        try:
            return bool(self.layer_done_counter.finish(counter_index))
        finally:
            self._batches.forget(counter_index)
            logger.info("radixlink load batch %d: the forward waited %.4f s on it",
                        counter_index, self.layer_done_counter.pop_waited(counter_index))

    @never_raises(zero)
    def num_completed_loads(self) -> int:
        """Load batches whose transfer has ended (landed or failed) and not yet popped or
        finished. The verdict is ``finish_layer_wise_loading``'s (SGLang 0.5.23)."""
        return self._batches.num_ended()

    @never_raises(empty_list)
    def pop_completed_load(self) -> list[str]:
        """The request ids of the oldest ended load batch, consumed (``[]`` when none)."""
        return self._batches.pop_ended()

    @never_raises(false)
    def cancel_queued_load(self, rid: str) -> bool:
        return self._pending.pop(rid, None) is not None

    @never_raises(false)
    def offload(self, transfers: list[PoolTransfer], session_id: str | None = None) -> bool:
        """Queue the pages of one node (every pool as one put); completes in order. Pools
        another rank writes (replicated ones, off rank 0) are skipped here, and so are pages
        the store holds (SGLang 0.5.23 offloads a path it loaded from the store again), unless
        the node holds a page a lookup found stored but never read: then all are written."""
        moves: list[PageMove] = []
        for transfer in transfers:
            pool = self._known_pool(transfer)
            if pool is None or not transfer.keys or transfer.device_indices is None:
                return False
            if self._keys.writes(pool):
                moves.append(self._move(pool, transfer))
        ready = self.record_offload_ready() if self._device.type == "cuda" else []
        unread = any(key in self._unread for move in moves for key in move.keys)
        job = offload_job(self._engine.arena, moves, ready, skip_present=not unread)
        place = self._offloads.open()  # NOTE: before submit: a job may end inside it
        job.done = functools.partial(self._offload_ended, place)
        try:
            self._engine.submit(job)
        except Exception:
            self._offloads.withdraw(place)  # the guard answers False: nothing was queued
            self._engine.release(job)
            raise
        return True

    def _offload_ended(self, place: Any, done: Completion) -> None:
        try:
            if done.written is not None:
                self._unread.discard(done.written.stored)
        finally:  # NOTE: SGLang waits for every offload's verdict
            self._offloads.end(place, done.ok)

    @never_raises(zero)
    def num_completed_offloads(self) -> int:
        """Offloads ended, counted in submission order (SGLang pops them in that order)."""
        return self._offloads.num_completed()

    @never_raises(false)
    def pop_completed_offload(self) -> bool:
        return self._offloads.pop()

    def stats(self) -> dict[str, int]:
        """The transfer engine's counters (jobs, pages fetched / bad / saved, staging)."""
        return self._engine.stats()

    @never_raises(nothing)
    def reset(self) -> None:
        """Drop queued loads, wait for running transfers, forget completions."""
        self._pending.clear()
        self._engine.wait_idle()
        self._offloads.clear()
        self._batches.clear()
        self.layer_done_counter.reset()

    @never_raises(nothing)
    def close(self) -> None:
        """Drop queued loads, close the engine (queued transfers go on for its
        ``CLOSE_BUDGET_S``, then are cancelled: a load fails its batch; running loads are
        waited for), close the store. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._pending.clear()
        self._engine.close()
        self._offloads.clear()
        self._batches.clear()
        self.layer_done_counter.reset()
        self._store.close()

    def _known_pool(self, transfer: PoolTransfer) -> PoolName | None:
        pool = _POOLS.get(str(transfer.name.value))
        return pool if pool is not None and pool in self._device_pools.pools else None

    def _move(self, pool: PoolName, transfer: PoolTransfer) -> PageMove:
        return PageMove(
            view=self._device_pools.pools[pool],
            codec=self._codecs[pool],
            keys=self._keys.keys(list(transfer.keys or ()), pool),
            slots=transfer.device_indices,
        )

    def _load_ended(self, index: int, moves: list[PageMove], done: Completion,
                    landing: Any) -> None:  # fmt: skip
        """On the I/O thread, once batch ``index`` landed or failed (its counter told)."""
        log_load(index, moves, done, landing)
        self._batches.ended(index)

    def _sync(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)


def _tp_rank_and_size(params: Any) -> tuple[int, int]:
    group = getattr(params, "attn_tp_cache_group", None) or getattr(params, "tp_cache_group", None)
    dist = torch.distributed
    if group is None or not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group=group), dist.get_world_size(group=group)
