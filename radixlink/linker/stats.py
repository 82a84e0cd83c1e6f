"""The linker's counters and load / offload latency histograms (docs/benchmarks.md,
Observability).

Owns stat shapes only; must not touch the tree, the store or the worker's threads.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from radixlink.linker.worker import Completion, TransferKind
from radixlink.metrics import LatencyHistogram


class LinkerStats:
    """Counters plus one latency histogram per transfer kind (fed on the caller's thread)."""

    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self.load_seconds = LatencyHistogram()
        self.offload_seconds = LatencyHistogram()

    def observe(self, done: Completion) -> None:
        """Record one applied completion's transfer time (failed ones included)."""
        hist = self.load_seconds if done.kind is TransferKind.LOAD else self.offload_seconds
        hist.observe(done.seconds)

    def snapshot(self, offload_stats: dict[str, Any], **gauges: int) -> dict[str, Any]:
        """Counters, the offload policy's stats, ``gauges`` and the two histograms'
        snapshots under ``load_seconds`` / ``offload_seconds``."""
        out: dict[str, Any] = dict(self.counters)
        out.update(offload_stats)
        out.update(gauges)
        out["load_seconds"] = self.load_seconds.snapshot()
        out["offload_seconds"] = self.offload_seconds.snapshot()
        return out
