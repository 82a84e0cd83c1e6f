"""``RadixlinkHiCacheStorage``: a radixlink store as SGLang's HiCache L3 storage backend.

Owns the ``HiCacheStorage`` contract: v1 zero-copy page I/O against the registered host pool,
v2 per-pool I/O and presence for hybrid pools. SGLang calls them synchronously: each runs as
one ``pages.engine.TransferEngine`` job on the caller's thread (``run``), under the engine's
corrupt-page policy, bad keys and stats. Must not touch SGLang's cache controller or
tree; imports SGLang.

Launch (docs/integrations.md)::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "radixlink",
        "module_path": "radixlink.integrations.sglang.hicache",
        "class_name": "RadixlinkHiCacheStorage", "interface_v1": 1,
        "store": "redis://127.0.0.1:6379/0"}'
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolTransfer,
    PoolTransferResult,
)
from sglang.srt.mem_cache.hicache_storage import (
    PoolName as SGLangPoolName,
)

from radixlink.contract import PoolHitPolicy as RadixlinkHitPolicy
from radixlink.contract import PoolName
from radixlink.integrations.sglang.guard import false, false_per_key, never_raises, nothing, zero
from radixlink.integrations.sglang.host_pages import HostPages
from radixlink.integrations.sglang.keyspace import KeySpace
from radixlink.integrations.sglang.settings import (
    SGLANG_HICACHE_KEYS,
    SUPPORTED_MODELS,
    parse_settings,
)
from radixlink.pages import pageio
from radixlink.pages.engine import Job, TransferEngine, TransferKind
from radixlink.pages.restore import PoolPresence, PoolRule, restorable_prefix_pages, split_presence
from radixlink.pages.staging import StagingArena
from radixlink.stores.keys import KEY_PREFIX
from radixlink.stores.registry import open_reachable_store

logger = logging.getLogger(__name__)

_POOLS = {pool.value: pool for pool in PoolName}


class RadixlinkHiCacheStorage(HiCacheStorage):
    """HiCache pages in a radixlink store, keyed by SGLang's page hashes.

    Keys: ``v4/<namespace id>/<SGLang hash>/<pool>[/r<tp rank>]``; the namespace id covers
    ``namespace`` (default: the model), the host page layout and the TP / PP / CP shape.
    MLA KV (identical on every rank) has no rank part and is written by SGLang's one storage
    writer; other pools carry the rank. Pages go through radixlink's page I/O
    (``pages.pageio``): a page failing its checksum, layout fingerprint or key digest reads
    as a per-page ``False`` and is deleted from the store (presence reads it absent, so
    SGLang writes the recomputed page again).

    Args:
        storage_config: SGLang's ``HiCacheStorageConfig``; ``extra_config`` holds ``store``,
            ``namespace``, ``checksum`` beside SGLang's own keys, and must set
            ``interface_v1`` (the zero-copy page path).
        kwargs: what SGLang's factory passes to dynamic backends (unused).

    Raises:
        ValueError: a bad or unknown config key, or ``interface_v1`` unset (and, at
            registration, a host pool other than kv / swa / mamba).
        StoreError: the store is unreachable at startup (one presence check).

    After startup no page or presence call raises into SGLang (``guard.never_raises``).
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Any = None) -> None:
        extra = storage_config.extra_config or {}
        if not extra.get("interface_v1"):
            raise ValueError(
                'radixlink HiCache backend needs "interface_v1": 1 in '
                "--hicache-storage-backend-extra-config (it implements the zero-copy page API)"
            )
        self._settings = parse_settings(
            extra, model_name=storage_config.model_name, passthrough=SGLANG_HICACHE_KEYS
        )
        self._config = storage_config
        self._store = open_reachable_store(self._settings.store)
        self._keys: KeySpace | None = None
        self._pages: dict[PoolName, HostPages] = {}
        self._codecs: dict[PoolName, pageio.Codec] = {}
        # NOTE: every call runs on SGLang's thread (``run``): one I/O thread stays idle
        self._engine = TransferEngine(self._store, 1, StagingArena(), name="radixlink-hicache")

    # ---- host pool registration ----

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """The anchor (KV) host pool: fixes the page layout and the store namespace."""
        super().register_mem_pool_host(mem_pool_host)
        self._add_pool(PoolName.KV, mem_pool_host)
        cfg = self._config
        layout = (
            f"{self._pages[PoolName.KV].fingerprint}|tp={cfg.tp_size}|pp={cfg.pp_rank}/"
            f"{cfg.pp_size}|cp={cfg.attn_cp_rank}/{cfg.attn_cp_size}"
        )
        replicated = frozenset({PoolName.KV}) if cfg.is_mla_model else frozenset()
        self._keys = KeySpace.create(
            namespace=self._settings.namespace, layout=layout, rank=cfg.tp_rank,
            replicated=replicated,
        )

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        pool = _POOLS.get(str(getattr(host_pool_name, "value", host_pool_name)))
        if pool is None:
            raise ValueError(
                f"radixlink HiCache backend: host pool {host_pool_name!r} is not supported; "
                f"{SUPPORTED_MODELS}"
            )
        self._add_pool(pool, host_pool)

    # ---- v1: KV pages, zero-copy against the host pool ----

    @never_raises(zero)
    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        """How many of ``keys`` are stored, counted from the first (a prefix)."""
        return pageio.leading_present(self._exists(keys, PoolName.KV))

    @never_raises(false)
    def exists(self, key: str) -> bool:
        return self._exists([key], PoolName.KV)[0]

    @never_raises(false_per_key)
    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Read each page into its host slots; per page True when it arrived verified."""
        return self._get(PoolName.KV, keys, host_indices)

    @never_raises(false_per_key)
    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Write each page from its host slots; per page True when the store accepted it."""
        return self._set(PoolName.KV, keys, host_indices)

    # ---- v2: hybrid pools ----

    @never_raises(lambda *_, **__: PoolTransferResult.empty())
    def batch_exists_v2(
        self,
        keys: list[str],
        pool_transfers: list[PoolTransfer] | None = None,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> PoolTransferResult:
        """Longest KV prefix, each extra pool's own hit, and every restorable length.

        ``restorable_prefix_pages`` comes from radixlink's restorable rule: KV pages 0..L-1,
        plus, per extra pool, its pages under the rule of its hit policy (TRAILING_PAGES:
        the ``len(transfer.keys)`` pages ending at L). Presence of a pool is asked for every
        KV key.
        """
        rules = [PoolRule(PoolName.KV, RadixlinkHitPolicy.ALL_PAGES)]
        for transfer in pool_transfers or []:
            pool = _POOLS.get(str(transfer.name.value))
            if pool is None or transfer.hit_policy == PoolHitPolicy.BLOCK_GROUPS:
                raise ValueError(
                    f"radixlink HiCache backend: pool {transfer.name} with hit policy "
                    f"{transfer.hit_policy} is not supported"
                )
            policy = RadixlinkHitPolicy(transfer.hit_policy.value)
            trailing = policy is RadixlinkHitPolicy.TRAILING_PAGES
            window = max(1, len(transfer.keys or ())) if trailing else 0
            rules.append(PoolRule(pool, policy, window))
        key_space = self._require_keys()
        flags = pageio.present(
            self._store, [k for rule in rules for k in key_space.keys(keys, rule.name)],
            self._engine.bad,
        )
        return _hit_result(split_presence(rules, flags, [len(keys)] * len(rules)))

    @never_raises(lambda transfers, *_, **__: _false_per_transfer(transfers))
    def batch_get_v2(
        self,
        transfers: list[PoolTransfer],
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> dict[str, list[bool]]:
        return {
            t.name: self._get(self._pool_of(t), t.keys or [], t.host_indices) for t in transfers
        }

    @never_raises(lambda transfers, *_, **__: _false_per_transfer(transfers))
    def batch_set_v2(
        self,
        transfers: list[PoolTransfer],
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> dict[str, list[bool]]:
        return {
            t.name: self._set(self._pool_of(t), t.keys or [], t.host_indices) for t in transfers
        }

    # ---- legacy tensor API: not used with interface_v1 ----

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        raise NotImplementedError("radixlink HiCache backend serves the page API only (v1/v2)")

    def batch_get(self, keys: list[str], target_locations: Any = None,
                  target_sizes: Any = None) -> Any:
        raise NotImplementedError("radixlink HiCache backend serves the page API only (v1/v2)")

    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        raise NotImplementedError("radixlink HiCache backend serves the page API only (v1/v2)")

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        raise NotImplementedError("radixlink HiCache backend serves the page API only (v1/v2)")

    # ---- lifecycle ----

    @never_raises(nothing)
    def clear(self) -> None:
        """Remove this namespace's pages from the store."""
        if self._keys is not None:
            self._store.clear(f"{KEY_PREFIX}{self._keys.namespace_id}/")

    def get_stats(self) -> Any:
        return None  # NOTE: SGLang wants its StorageMetrics here; radixlink's are ``stats()``

    def stats(self) -> dict[str, int]:
        """The transfer engine's counters (jobs, pages fetched / bad / saved, staging)."""
        return self._engine.stats()

    @never_raises(nothing)
    def close(self) -> None:
        self._engine.close()
        self._store.close()

    # ---- helpers ----

    def _add_pool(self, pool: PoolName, host_pool: Any) -> None:
        pages = HostPages(host_pool)
        self._pages[pool] = pages
        self._codecs[pool] = pageio.make_codec(
            pages.fingerprint, pages.page_bytes, secret=self._store.page_secret,
            checksum=self._settings.checksum,
        )

    def _require_keys(self) -> KeySpace:
        if self._keys is None:
            raise ValueError("radixlink HiCache backend: no host pool registered yet")
        return self._keys

    def _pool_of(self, transfer: PoolTransfer) -> PoolName:
        pool = _POOLS.get(str(transfer.name.value))
        if pool is None or pool not in self._pages:
            raise ValueError(f"radixlink HiCache backend: pool {transfer.name} is not registered")
        return pool

    def _exists(self, keys: list[str], pool: PoolName) -> list[bool]:
        return pageio.present(self._store, self._require_keys().keys(keys, pool),
                              self._engine.bad)

    def _get(self, pool: PoolName, keys: list[str], host_indices: Any) -> list[bool]:
        """One LOAD job with no lander: the engine reads and verifies every page into staging,
        then the verified ones land into their host slots with one batched scatter."""
        pages, codec = self._pages[pool], self._codecs[pool]
        if not keys or host_indices is None or host_indices.numel() != len(keys) * pages.page_size:
            return [False] * len(keys)
        store_keys = self._require_keys().keys(keys, pool)
        staging, parts = pageio.stage_pages(self._engine.arena, [(codec, store_keys)])
        job = Job(kind=TransferKind.LOAD, parts=parts, staging=staging)
        try:
            done = self._engine.run(job)
            if done.read is None:  # NOTE: the store failed: nothing arrived
                logger.warning("radixlink hicache get of %d %s pages failed: %s", len(keys),
                               pool.value, done.detail)
                return [False] * len(keys)
            ok = [why is None for why in done.read.reasons]
            good = [i for i, flag in enumerate(ok) if flag]
            landed = time.perf_counter()
            if len(good) == len(keys):  # NOTE: straight from the staging frames, no copy
                pages.write(host_indices, parts[0].frames.payloads())
            elif good:
                data = parts[0].frames.payloads()[good]
                slots = host_indices.reshape(len(keys), pages.page_size)[good].reshape(-1)
                pages.write(slots, data)
            land_s = time.perf_counter() - landed
        finally:
            self._engine.release(job)
        logger.info("radixlink hicache get: %d of %d %s pages, %d bytes; read and verified in "
                    "%.4f s, landed in %.4f s", len(good), len(keys), pool.value,
                    len(good) * pages.page_bytes, done.seconds, land_s)
        return ok

    def _set(self, pool: PoolName, keys: list[str], host_indices: Any) -> list[bool]:
        """One OFFLOAD job run here: the host pages copied into staging, encoded, one put."""
        pages, codec = self._pages[pool], self._codecs[pool]
        if not keys or host_indices is None or host_indices.numel() != len(keys) * pages.page_size:
            return [False] * len(keys)
        keyspace = self._require_keys()
        if pool in keyspace.replicated and not self._config.is_storage_writer:
            return [True] * len(keys)  # another rank writes this replicated page
        store_keys = keyspace.keys(keys, pool)
        staging, parts = pageio.stage_pages(self._engine.arena, [(codec, store_keys)])

        def fill() -> None:
            parts[0].frames.payloads().copy_(pages.read(host_indices))

        done = self._engine.run(Job(kind=TransferKind.OFFLOAD, parts=parts, staging=staging,
                                    fill=fill))
        if done.written is None:
            logger.warning("radixlink hicache set of %d %s pages failed: %s", len(keys),
                           pool.value, done.detail)
            return [False] * len(keys)
        stored = set(done.written.stored)
        return [key in stored for key in store_keys]


def _false_per_transfer(transfers: Any) -> dict[str, list[bool]]:
    """``batch_get_v2`` / ``batch_set_v2``'s answer when the call failed: nothing moved."""
    return {t.name: [False] * len(t.keys or ()) for t in transfers or ()}


def _hit_result(presence: list[PoolPresence]) -> PoolTransferResult:
    """SGLang's ``PoolTransferResult``: KV prefix, per-pool hits, restorable lengths."""
    kv = presence[0]
    kv_pages = next((i for i, ok in enumerate(kv.present) if not ok), len(kv.present))
    # NOTE: keyed by SGLang's PoolName, as its own backends do (a str enum hashes by name).
    hits: dict[Any, int] = {SGLangPoolName.KV: kv_pages} if kv_pages else {}
    restorable = set(range(1, kv_pages + 1))
    for extra in presence[1:]:
        if not restorable:
            break
        own = restorable_prefix_pages(kv_pages, [_truncate(extra, kv_pages)])
        if own.best:
            hits[SGLangPoolName(extra.name.value)] = own.best
        restorable &= set(own.restorable_prefix_pages)
    ordered = sorted(restorable)
    return PoolTransferResult(ordered[-1] if ordered else 0, hits, ordered)


def _truncate(presence: PoolPresence, num_pages: int) -> PoolPresence:
    return PoolPresence(
        name=presence.name, hit_policy=presence.hit_policy,
        present=presence.present[:num_pages], window_pages=presence.window_pages,
    )
