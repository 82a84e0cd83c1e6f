"""``RadixlinkConnector``: radixlink stores behind vLLM's v1 KV connector API (hybrid aware).

Owns the mapping of vLLM's calls onto ``SchedulerSide`` (scheduler process) and ``WorkerSide``
(each worker process). Must not reach into vLLM's block manager or radixlink's own tree.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from radixlink.integrations.vllm.events import StoreEvents, kv_events_enabled
from radixlink.integrations.vllm.keys import KeyScheme, group_layouts
from radixlink.integrations.vllm.metadata import RadixlinkMetadata
from radixlink.integrations.vllm.reports import RadixlinkKVEvents
from radixlink.integrations.vllm.scheduler_side import SchedulerSide
from radixlink.integrations.vllm.settings import (
    ConnectorSettings,
    check_hash_settings,
    hit_source,
    tp_rank_and_size,
)
from radixlink.integrations.vllm.stats import RadixlinkPromMetrics, RadixlinkStats, stats_or_none
from radixlink.integrations.vllm.worker_side import WorkerSide
from radixlink.stores.registry import open_store

if TYPE_CHECKING:
    from collections.abc import Iterable

    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.config.kv_transfer import KVCacheAccess
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorPromMetrics,
        KVConnectorStats,
    )
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)


class RadixlinkConnector(KVConnectorBase_V1, SupportsHMA):
    """A shared prefix tier for vLLM: pages of every attention group in a radixlink store.

    Loaded with ``--kv-transfer-config '{"kv_connector": "RadixlinkConnector",
    "kv_connector_module_path": "radixlink.integrations.vllm", "kv_role": "kv_both",
    "kv_load_failure_policy": "recompute", "kv_connector_extra_config": {"store": URL}}'``
    (keys: ``radixlink.integrations.vllm.settings.EXTRA_CONFIG_KEYS``; docs/integrations.md).

    Loads are asynchronous: ``get_num_new_matched_tokens`` returns ``(tokens, True)``, the
    request waits while its pages arrive, and a page that is missing, corrupt or under the
    wrong layout comes back as a load error, so ``recompute`` recomputes it. Pages are saved
    in the step that computes them; a finished request's last pages are saved before vLLM
    frees its blocks.

    Raises:
        ValueError: bad ``kv_connector_extra_config``, an xxhash prefix-caching algorithm
            without PYTHONHASHSEED, or pipeline parallelism.
    """

    _cache_hit_source = CacheHitSource.DISK

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig):  # fmt: skip
        super().__init__(vllm_config, role, kv_cache_config)
        settings = ConnectorSettings.from_extra_config(
            self._kv_transfer_config.kv_connector_extra_config
        )
        cache_config = vllm_config.cache_config
        check_hash_settings(cache_config.prefix_caching_hash_algo, settings.key_scheme)
        tp_rank, tp_size = tp_rank_and_size(vllm_config.parallel_config)
        layout_name = cache_config.kv_cache_layout or kv_cache_config.kv_cache_layout or "auto"
        layouts, reason = group_layouts(kv_cache_config, layout_name=layout_name, tp_size=tp_size)
        if reason:
            logger.warning("RadixlinkConnector takes no part: %s", reason)
        algo = (settings.token_chain_algo if settings.key_scheme == "token_chain"
                else cache_config.prefix_caching_hash_algo)  # fmt: skip
        scheme = KeyScheme(
            model=settings.namespace or vllm_config.model_config.model,
            scheme=settings.key_scheme, algo=algo,
            hash_block_size=kv_cache_config.hash_block_size or cache_config.block_size,
        )  # fmt: skip
        store = open_store(settings.store_url)
        if not store.shared:
            # NOTE: a warning, not an error: bench/vllm_connector.py times the scheduler side
            # alone on a memory:// store
            logger.warning(
                "RadixlinkConnector: store %s lives in one connector's memory; vLLM's scheduler "
                "and each worker open their own, so no saved page is ever found. Use a store "
                "they share: file:///path/to/dir or redis://host:port/0", settings.store_url)
        # NOTE: per instance: vLLM's per-source hit metrics name the store's tier (disk for
        # file://, external_unspecified for a remote store); the base class reads it.
        self._cache_hit_source = CacheHitSource(hit_source(settings.store_url))
        if (role == KVConnectorRole.SCHEDULER
                and getattr(self._kv_transfer_config, "kv_load_failure_policy", "") == "fail"):
            logger.warning(
                "RadixlinkConnector: kv_load_failure_policy is 'fail' (vLLM's default), so a "
                "store page that is missing or bad when read fails its request. radixlink "
                "verifies every page and reports a bad one as a load error: set "
                "\"kv_load_failure_policy\": \"recompute\" in --kv-transfer-config to recompute "
                "those tokens instead")  # fmt: skip
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        events = kv_events_enabled(vllm_config) and bool(layouts)
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerSide(
                layouts=layouts, scheme=scheme, store=store, tp_size=tp_size,
                load=settings.load, save=settings.save,
                events=StoreEvents(layouts=layouts, scheme=scheme, store=store, tp_size=tp_size,
                                   kv_cache_config=kv_cache_config,
                                   store_url=settings.store_url) if events else None,
            )  # fmt: skip
        else:
            self._worker = WorkerSide(
                layouts=layouts, scheme=scheme, store=store, tp_rank=tp_rank,
                num_threads=settings.num_threads,
                max_inflight_save_bytes=settings.max_inflight_save_bytes,
                block_errors=len(kv_cache_config.kv_cache_groups) == 1, kv_events=events,
            )  # fmt: skip
        self._num_blocks = kv_cache_config.num_blocks

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # NOTE: a best-effort cache: a dropped save is a later miss

    @property
    def worker(self) -> WorkerSide:
        """The worker-side half (worker role only): ``flush``, ``stats``."""
        assert self._worker is not None, "the scheduler-role connector has no worker side"
        return self._worker

    # ---- worker side -------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.worker.register(kv_caches, self._num_blocks)

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: Any) -> bool:
        return True  # NOTE: vLLM 0.33+: views dropped on unregister, rebound on restore

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: KVTransferConfig) -> KVCacheAccess:
        """vLLM 0.34: ``IN_PROCESS``. Workers read and write the KV cache with torch index ops
        on the model runner's thread (gather into host staging, scatter from it); they
        register it with no RDMA engine and export no handle, so any allocation (vLLM's
        extensible KV cache included) works."""
        from vllm.config.kv_transfer import KVCacheAccess  # NOTE: vLLM 0.34+, the only caller

        return KVCacheAccess.IN_PROCESS

    @classmethod
    def supports_lookahead_block_hashes(cls, kv_transfer_config: KVTransferConfig) -> bool:
        """vLLM 0.34: False (vLLM's default; docs/integrations.md, "Supported vLLM releases").
        A page's key must name every token its KV depends on: with lookahead hashes an
        EAGLE drafter's KV at a block's end depends on tokens past the block, which
        ``token_chain`` keys do not cover, and no suite here runs a drafter. vLLM then drops
        the trailing cached block under EAGLE instead (one page per hit recomputed)."""
        return False

    def unregister_kv_caches(self) -> None:
        self.worker.unregister()

    def restore_kv_caches(self) -> None:
        self.worker.restore()

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, RadixlinkMetadata), type(meta).__name__
        self.worker.start_loads(meta.loads)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # NOTE: loads are asynchronous: a request runs only after its pages were scattered
        # (transfer_results), so no layer of this step's forward waits on the store.
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: AttentionMetadata, **kwargs: Any) -> None:  # fmt: skip
        return  # NOTE: pages are copied out once per step, in wait_for_save

    def wait_for_save(self) -> None:
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, RadixlinkMetadata), type(meta).__name__
        self.worker.save(meta.saves)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        sending, recving, failed = self.worker.transfer_results()
        return KVConnectorTransferResults(
            finished_sending=sending, finished_recving=recving, failed_recving=failed
        )

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.take_load_errors()

    def get_kv_connector_kv_cache_events(self) -> RadixlinkKVEvents | None:
        """What this worker's store I/O did since the last step (for the scheduler side's
        ``take_events``), or None."""
        reports = self._worker.reports if self._worker is not None else None
        return reports.take() if reports is not None else None

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        """This interval's counters (worker: loads, saves, heals; scheduler: lookups), or
        None when nothing was counted; vLLM sums them over ranks and logs them."""
        if self._worker is not None:
            return stats_or_none(self._worker.take_stats())
        return stats_or_none(self.scheduler_side.take_stats())

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats:
        return RadixlinkStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: VllmConfig, metric_types: dict[type, type],
                           labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]
                           ) -> KVConnectorPromMetrics:  # fmt: skip
        return RadixlinkPromMetrics(vllm_config, metric_types, labelnames,
                                    per_engine_labelvalues)

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()
        if self._scheduler is not None:
            self._scheduler.store.close()

    # ---- scheduler side ----------------------------------------------------------------

    @property
    def scheduler_side(self) -> SchedulerSide:
        """The scheduler-side half (scheduler role only)."""
        assert self._scheduler is not None, "the worker-role connector has no scheduler side"
        return self._scheduler

    def bind_gpu_block_pool(self, gpu_block_pool: BlockPool) -> None:
        self.scheduler_side.set_null_block_id(gpu_block_pool.null_block.block_id)

    def on_new_request(self, request: Request) -> None:
        self.scheduler_side.add_request(request)

    def may_load_async(self, request: Request) -> bool:
        """vLLM 0.34: whether this request may start an asynchronous store load while the
        running batch is full (with ``--max-num-inflight-kv-loads``). Cheap: no store call."""
        return self.scheduler_side.may_load(request)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        tokens = self.scheduler_side.lookup(request, num_computed_tokens)
        return tokens, tokens > 0

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:  # fmt: skip
        self.scheduler_side.plan_load(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self.scheduler_side.build_meta(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self.scheduler_side.loads_done(
            set(connector_output.finished_recving or ()),
            set(connector_output.failed_recving or ()),
            set(connector_output.invalid_block_ids or ()),
        )
        events = self.scheduler_side.events
        if events is not None:
            events.absorb(getattr(connector_output, "kv_cache_events", None))

    def take_events(self) -> Iterable[KVCacheEvent]:
        """The store's KV events (``STORAGE``) since the last step, for vLLM's publisher."""
        events = self.scheduler_side.events
        return events.take() if events is not None else ()

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:  # fmt: skip
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(self, request: Request, block_ids: tuple[list[int], ...]
                                    ) -> tuple[bool, dict[str, Any] | None]:  # fmt: skip
        return self.scheduler_side.finish(request, block_ids), None
