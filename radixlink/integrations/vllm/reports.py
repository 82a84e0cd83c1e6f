"""The workers' half of the store's KV events: what each rank's store I/O did to which page
(saved or found present, verified by a load, deleted as bad), collected from the I/O threads and
shipped to the scheduler in vLLM's ``KVConnectorOutput.kv_cache_events`` container, where
``events.StoreEvents`` turns them into vLLM's events.

Owns the report records and their collection. Must not build vLLM events or touch KV tensors;
never raises into a transfer (a lost report is a missing event).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_events import KVConnectorKVEvents

from radixlink.integrations.vllm.metadata import GroupPages, PageJob

logger = logging.getLogger(__name__)
KeysFn = Callable[[PageJob, int, Sequence[str]], list[str]]


@dataclass(frozen=True, slots=True)
class StoreReport:
    """What one rank's store I/O did: ``hashes`` (page hashes of the key scheme) of group
    ``group_id`` are in the store (``stored``) or were deleted as bad."""

    rank: int
    stored: bool
    group_id: int
    hashes: tuple[str, ...]


class RadixlinkKVEvents(KVConnectorKVEvents):
    """The reports of one step in vLLM's container (``KVOutputAggregator`` merges the ranks');
    the scheduler side counts ranks per page itself (``StoreReport.rank``)."""

    def __init__(self, reports: Sequence[StoreReport] = ()) -> None:
        self._reports = list(reports)
        self._workers = 1

    def add_events(self, events: list[Any]) -> None:
        self._reports.extend(events)

    def aggregate(self) -> RadixlinkKVEvents:
        return self

    def increment_workers(self, count: int = 1) -> None:
        self._workers += count

    def get_all_events(self) -> list[Any]:
        return list(self._reports)

    def get_number_of_workers(self) -> int:
        return self._workers

    def clear_events(self) -> None:
        self._reports.clear()


class WorkerReports:
    """One worker's reports, added by its I/O threads, taken on the model runner's thread.

    Args:
        rank: the worker's TP rank.
        keys: the worker's ``(job, group id, hashes) -> store keys``.
    """

    def __init__(self, rank: int, keys: KeysFn) -> None:
        self._rank = rank
        self._keys = keys
        self._reports: list[StoreReport] = []
        self._lock = threading.Lock()

    def after_write(self, job: PageJob, groups: Sequence[GroupPages],
                    failed: Sequence[str]) -> None:  # fmt: skip
        """A save's pages are in the store but those whose write ``failed``. Never raises."""
        try:
            bad = set(failed)
            for g in groups:
                keys = self._keys(job, g.group_id, g.hashes) if bad else ()
                hashes = [h for h, k in zip(g.hashes, keys) if k not in bad] if bad else g.hashes
                self._add(True, g.group_id, hashes)
        except Exception:  # noqa: BLE001 - a lost report is a missing event, not a failed save
            logger.exception("radixlink: KV events of a save dropped")

    def after_read(self, jobs: Sequence[PageJob], batch: Any) -> None:
        """A load batch (``loads.FetchedBatch``): its verified pages are in the store, its
        bad present pages were deleted. Never raises (the batch must still complete)."""
        try:
            self._read(jobs, batch)
        except Exception:  # noqa: BLE001 - a lost report is a missing event, not a failed load
            logger.exception("radixlink: KV events of a load dropped")

    def _read(self, jobs: Sequence[PageJob], batch: Any) -> None:
        for job, load in zip(jobs, batch.requests):
            by_group = {g.group_id: g for g in job.groups}
            for gid, block_ids, _ in load.pages:
                self._add(True, gid, by_group[gid].hashes[: len(block_ids)])
        if not batch.bad_keys:
            return
        named = {k: (g.group_id, h) for job in jobs for g in job.groups
                 for k, h in zip(self._keys(job, g.group_id, g.hashes), g.hashes)}  # fmt: skip
        removed: dict[int, list[str]] = {}
        for key in batch.bad_keys:
            if key in named:
                gid, h = named[key]
                removed.setdefault(gid, []).append(h)
        for gid, hashes in removed.items():
            self._add(False, gid, hashes)

    def take(self) -> RadixlinkKVEvents | None:
        """The reports since the last call (None when there are none)."""
        with self._lock:
            reports, self._reports = self._reports, []
        return RadixlinkKVEvents(reports) if reports else None

    def _add(self, stored: bool, group_id: int, hashes: Sequence[str]) -> None:
        if hashes:
            with self._lock:
                self._reports.append(StoreReport(self._rank, stored, group_id, tuple(hashes)))
