"""``LoadFinisher``: what a finished load transfer becomes (DESIGN.md section 5b, steps 4-5):
agreed across ranks, then published and committed, or ABORTed; the stored marks of what
loaded, the cost model's observation and the load counters.

Owns that decision only; returns the members' outcomes for the linker to hand out. Reaches the
tree only through ``publish`` / ``release`` and the cache's ``unlock``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from radixlink.cost import Source
from radixlink.linker.loads import Transfer
from radixlink.linker.outcomes import failure_outcome, failure_reason, success_outcomes
from radixlink.linker.phases import publish, release
from radixlink.linker.records import LoadOutcome
from radixlink.linker.worker import Completion, TransferStatus


class LoadFinisher:
    """Applies finished load transfers.

    Args:
        cache: the linked cache.
        ranks: the rank group (success is agreed: one rank failing fails all).
        offload: the linker's ``OffloadPolicy`` (marks what loaded as stored).
        page_hashes: the linker's ``PageHashMemo`` (the publish reuses the lookup's hashes).
        stats: the linker's counters.
        cost_model: an ``EstimateTracker`` that learns from loads, or None.
    """

    def __init__(self, cache: Any, ranks: Any, offload: Any, page_hashes: Any,
                 stats: Counter[str], cost_model: Any):
        self.cache, self.ranks, self.offload = cache, ranks, offload
        self.page_hashes, self._stats, self.cost_model = page_hashes, stats, cost_model

    def finish(self, transfer: Transfer, done: Completion, closed: bool) -> list[LoadOutcome]:
        """Publish ``transfer`` (every rank's part landed and verified) or ABORT it; the
        outcome of each of its members. A collective with several ranks."""
        reservation, cache = transfer.reservation, self.cache
        ok = self.ranks.all_ok(done.ok and not transfer.cancelled and not closed)
        if done.status is TransferStatus.CORRUPT:
            self._stats["checksum_misses"] += 1
        if done.status in (TransferStatus.CORRUPT, TransferStatus.MISSING):
            # NOTE: pageio deleted the bad pages: the recomputed ones must be written again
            for t in reservation.transfers:
                if t is not None:
                    self.offload.known.discard(t.name, t.keys)
        reason = "" if ok else failure_reason(done, transfer, closed)
        if ok:
            lookup = reservation.lookup
            self.page_hashes.remember(lookup.namespace, lookup.tokens.tobytes(),
                                      lookup.prefix_len // cache.page_size, lookup.keys)
            try:
                result = publish(cache, cache.components, reservation)
            except ValueError as exc:  # the insert refused before changing anything
                ok, reason = False, f"publish refused: {exc}"
                self._stats["failures_publish"] += 1
        if not ok:
            if reason != "cancelled":
                self._stats["failures_load"] += 1
            failed = [failure_outcome(member, reason) for member in transfer.members]
            release(cache, reservation)
            return failed
        self.offload.mark_loaded(result.last_node, reservation.prefix_len,
                                 reservation.transfers)
        if self.cost_model is not None:
            self.cost_model.observe_load(Source.STORE, done.num_bytes, done.seconds)
        self._stats["loaded_bytes"] += done.num_bytes
        self._stats["loaded_pages"] += reservation.lookup.num_pages
        outcomes = list(success_outcomes(cache, transfer))
        for outcome in outcomes:
            self._stats["loaded_tokens"] += outcome.loaded_len  # the store tier's hits
        cache.unlock(reservation.handle)
        return outcomes
