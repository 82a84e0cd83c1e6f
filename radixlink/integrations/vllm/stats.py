"""The connector's counters in vLLM's connector-stats hooks: ``RadixlinkStats`` (what the workers
and the scheduler report each step, summed over ranks and steps, logged by vLLM as "KV Transfer
metrics") and ``RadixlinkPromMetrics`` (one Prometheus counter per stat on ``/metrics``).

Owns the stat names and their meaning. Must not count anything itself (worker_side.py and
scheduler_side.py do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

STATS = {
    "loaded_pages": "Pages loaded from the store into device blocks (per request)",
    "fetched_pages": "Pages read from the store (a page shared by a step's loads once)",
    "bad_pages": "Stored pages found bad (corrupt, foreign key, truncated, wrong layout, "
                 "unsealed) and deleted",
    "healed_pages": "Bad pages overwritten by their recomputed pages",
    "saved_pages": "Pages written to the store",
    "skipped_pages": "Computed pages not written: the store already held them",
    "dropped_saves": "Saves dropped: too many save bytes in flight",
    "failed_loads": "Loads with at least one page not loaded (recomputed)",
    "failed_saves": "Page writes the store refused or that failed",
    "lookups": "Store lookups of the scheduler",
    "hit_pages": "Pages the scheduler's lookups found in the store",
    "lookup_errors": "Store lookups that failed (treated as misses)",
    "unloaded_tokens": "Tokens vLLM counted as external at admission that a failed load "
                       "left to recompute",
}  # fmt: skip


@dataclass
class RadixlinkStats(KVConnectorStats):
    """Counters of one interval: ``data`` maps a ``STATS`` name to its count (missing: 0).

    vLLM ships ``data`` from the workers and the scheduler to its stat loggers, where
    ``build_kv_connector_stats`` turns it back into this class; ``aggregate`` sums.
    """

    def reset(self) -> None:
        self.data: dict[str, int] = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for name, value in other.data.items():
            self.data[name] = self.data.get(name, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        return {name: self.data[name] for name in STATS if self.data.get(name)}

    def is_empty(self) -> bool:
        return not any(self.data.values())


def stats_or_none(data: dict[str, int]) -> RadixlinkStats | None:
    """A stats record of ``data``, or None when nothing was counted (vLLM skips None)."""
    return RadixlinkStats(data=data) if any(data.values()) else None


class RadixlinkPromMetrics(KVConnectorPromMetrics):
    """One counter per ``STATS`` entry, ``vllm:radixlink_<name>`` (``_total`` on the wire),
    with vLLM's engine labels."""

    def __init__(self, vllm_config: Any, metric_types: dict[type, type], labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]):  # fmt: skip
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters = {}
        for name, documentation in STATS.items():
            counter = self._counter_cls(name=f"vllm:radixlink_{name}",
                                        documentation=documentation, labelnames=labelnames)
            for engine, values in per_engine_labelvalues.items():
                self._counters[(engine, name)] = counter.labels(*values)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, value in transfer_stats_data.items():
            counter = self._counters.get((engine_idx, name))
            if counter is not None and value:
                counter.inc(value)
