"""The offloader: write policies, batching, the in-flight byte budget, the stored index's
marks, and revalidation (DESIGN.md section 5b, "Offload").

Owns when nodes are exported and what the store is recorded to hold (``tree.stored``, the one
stored index: nodes' ``external_cache_stored`` / ``offload_inflight`` are views on it). Must
not free or allocate slots: page data is gathered into staging synchronously (queued on a side
stream on CUDA); encoding and the store write run on the transfer engine's threads.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from radixlink.contract import InsertParams, LinkerTransferPhase, PoolName
from radixlink.linker.config import WritePolicy
from radixlink.linker.jobs import Batch, offload_job, select_pages
from radixlink.linker.parts import LinkerParts
from radixlink.linker.revalidate import Revalidation
from radixlink.pages.engine import Completion
from radixlink.tree.stored import BACKBONE_POOL

_OFFLOAD = LinkerTransferPhase.OFFLOAD


@dataclass(slots=True, kw_only=True)
class Offload:
    """One offload in flight: the nodes it covers when queued, their backbone page hashes
    (marked in flight with ``ticket`` in the stored index; split fragments hold sub-lists of
    them), the pages it makes stored once confirmed, and the bytes it counts against the
    budget."""

    ticket: int
    nodes: list[Any]
    num_bytes: int
    num_pages: int
    written: list[tuple[PoolName, Sequence[str]]]  # (pool, page hashes) stored once confirmed
    ready: Any = None  # CUDA: the event of the gather into staging (None on CPU)
    hashes: list[Sequence[str]] = field(default_factory=list)


class Offloader:
    """Decides which nodes go to the store and records them in the stored index until, and
    once, the store confirms.

    Offloads queue on the engine thread and go to the transfer engine as one batch (one gather into
    one staging buffer, one job, one store ``put``). An offload goes out at once when none
    went out in the last ``batch_window_s``; otherwise it waits for company until the next
    offload after the window, ``batch_pages`` waiting pages, the linker's next ``poll`` /
    ``wait_load`` / ``flush``, or an eviction that would free a queued node's data. Under a
    stream of inserts that leaves a few list appends per insert and, per batch, one gather
    per pool and one thread handoff; a lone insert is not delayed.

    Marks are the stored index's, by page hash: a queued node's backbone pages carry its
    ticket, a confirmed write records every page it covered, so a node split while its offload
    is in flight (or a prefix inserted again) is marked by its pages, with no callback.

    Args:
        parts: the linker's shared parts (cache, ranks, guard, keys, codecs, engine jobs,
            arena, stored index). Of ``parts.config`` this uses ``write_policy``,
            ``write_through_threshold`` (hits before a ``write_through_selective`` offload;
            ``write_through`` uses 1: a node's creating insert counts as its first hit),
            ``max_inflight_bytes`` (queued or in flight before new offloads are dropped) and
            ``revalidate_after_s`` (age after which a stored mark is re-checked on a hit).
        batch_pages: queued pages that send a batch at once.
        batch_window_s: offloads within this long after a batch went out wait for company.
    """

    def __init__(self, parts: LinkerParts, *, batch_pages: int = 512,
                 batch_window_s: float = 0.005):
        self.parts = parts
        config, ranks = parts.config, parts.ranks
        self.cache, self.ranks, self.stored = parts.cache, ranks, parts.stored
        self.rank, self.world_size = ranks.rank, parts.world_size
        self.write_policy = write_policy = config.write_policy
        self.threshold = (1 if write_policy is WritePolicy.WRITE_THROUGH
                          else config.write_through_threshold)
        self.max_inflight_bytes = config.max_inflight_bytes
        # NOTE: a clock would batch differently on each rank, and ranks must submit the same
        # jobs in the same order: with several ranks every offload goes out at once.
        self.batch_pages = batch_pages
        self.batch_window_s = batch_window_s if self.world_size == 1 else 0.0
        self._last_sent = -float("inf")
        self._page_bytes: dict[PoolName, int] = {}
        self._inflight: dict[int, Offload] = {}  # ticket -> offload
        self._tickets: dict[int, int] = {}  # engine job id -> ticket
        self._inflight_bytes = 0
        self._next_ticket = 0
        self.batch: Batch | None = None  # queued, not yet sent (read-only outside)
        self._queued: list[Sequence[str]] = []  # backbone hashes of the batch's nodes
        self._stream: Any = None  # CUDA: the side stream offload gathers run on
        self._stats: Counter[str] = Counter()
        self.revalidation = Revalidation(ranks, parts.guard, self.stored, self._page_keys,
                                         config.revalidate_after_s, self._stats)

    # ---------------------------------------------------------------- triggers

    def on_insert(self, params: InsertParams, result: Any) -> None:
        """Count the insert's hit and offload the deepest node that reached the threshold."""
        node = result.last_node
        if params.chunked or node is None or node.parent is None:
            return
        if result.prefix_len < node.seq_len:
            node.hit_count += 1  # NOTE: the creating insert counts as the new leaf's first hit
            self._new_nodes(node, result.prefix_len)
        self._revalidate(node)
        if self.write_policy is WritePolicy.WRITE_BACK:
            return
        while node.parent is not None and node.hit_count < self.threshold:
            node = node.parent
        if node.parent is not None:
            self.offload_chain(self.cache.tree.backup_chain(node))

    def _new_nodes(self, node: Any, prefix_len: int) -> None:
        """Nodes this insert created whose pages the index holds (a prefix inserted again):
        counted as not written again, or, when offloads skip nothing, forgotten so they are
        written again (the same on every rank: the trees agree)."""
        stored = self.stored
        while node.parent is not None and node.start >= prefix_len:
            hashes = node.hash_value
            if hashes is not None and stored.holds(hashes):
                if stored.enabled:
                    stored.num_skipped += len(hashes)
                else:
                    stored.discard(BACKBONE_POOL, hashes)
            node = node.parent

    def before_evict(self, node: Any) -> None:
        """Eviction is about to free some of ``node``'s data: a queued batch is gathered now
        (on CUDA a queued gather of ``node`` finishes first); write_back exports ``node``
        (and unstored ancestors) first."""
        ticket = node.offload_inflight
        if ticket:
            if self.batch is not None and self.batch.ticket == ticket:
                self.flush_batch()
            offload = self._inflight.get(ticket)
            if offload is not None and offload.ready is not None:
                offload.ready.synchronize()
        if self.write_policy is WritePolicy.WRITE_BACK and not node.external_cache_stored:
            if self.offload_chain(self.cache.tree.backup_chain(node)):
                self.flush_batch()

    def offload_chain(self, chain: list[Any]) -> bool:
        """Queue the pages of ``chain`` (ancestors first) for the next batch; the batch goes
        out at once when ``batch_pages`` pages wait.

        Returns False when nothing was queued (nothing to write, or over the byte budget).
        """
        if not chain:
            return False
        cache, namespace = self.cache, _namespace_of(chain[0])
        transfers, num_pages, num_bytes = [], 0, 0
        for node in chain:
            for component in cache.components:
                transfer = component.build_external_linker_transfer(_OFFLOAD, node,
                                                                     node.hash_value)
                if transfer is None:
                    continue
                # NOTE: counted on every rank, written or not, so the budget decides alike
                page_bytes = self._page_bytes.get(transfer.name)
                if page_bytes is None:
                    page_bytes = self._page_bytes[transfer.name] = cache.pool(
                        transfer.name).page_bytes
                num_bytes += len(transfer.keys) * page_bytes
                num_pages += len(transfer.keys)
                transfers.append((namespace, transfer))
        if self._inflight_bytes + num_bytes > self.max_inflight_bytes:
            self._stats["dropped_offloads"] += 1
            return False
        batch = self.batch
        if batch is None:
            self._next_ticket += 1
            batch = self.batch = Batch(self._next_ticket)
        for node in chain:
            self.stored.set_inflight(node.hash_value, batch.ticket)
            self._queued.append(node.hash_value)  # NOTE: a split later makes new lists
        batch.nodes.extend(chain)
        batch.transfers.extend(transfers)
        batch.num_pages += num_pages
        batch.num_bytes += num_bytes
        self._inflight_bytes += num_bytes
        self._stats["offloads"] += 1
        if (batch.num_pages >= self.batch_pages
                or time.monotonic() - self._last_sent >= self.batch_window_s):
            self.flush_batch()
        return True

    def flush_batch(self) -> None:
        """Send the queued offloads: the pages the store is not known to hold, gathered into
        one staging buffer, as one engine job. A batch whose every page is known writes
        nothing: its nodes are stored already, by their pages."""
        batch, self.batch = self.batch, None
        if batch is None:
            return
        queued, self._queued = self._queued, []
        self._last_sent = time.monotonic()
        skip: set[PoolName] = set()
        if self.rank != 0:
            skip = {t.name for _, t in batch.transfers if self.parts.replicated(t.name)}
        parts, _ = select_pages(batch, self.cache, self.parts.keyspace, self.stored, skip)
        # NOTE: with several ranks a rank with nothing to write (replicated pools on rank > 0)
        # still submits its (empty) job: every rank must submit the same jobs.
        if not parts and self.world_size == 1:  # all known: write nothing
            self._inflight_bytes -= batch.num_bytes
            for hashes in queued:
                self.stored.clear_inflight(hashes, batch.ticket)
            self._stats["known_offloads"] += 1
            return
        stream = None if self.cache.device.type != "cuda" else self._side_stream()
        job = offload_job(parts, self.parts.codec, self.parts.arena, stream)
        ready = job.ready[0] if job.ready else None
        job_id = self.parts.jobs.submit(job)
        self._tickets[job_id] = batch.ticket
        # NOTE: what a confirmed write makes stored: the pages written here, and those of
        # pools another rank writes (the rank group agrees on success)
        written: list[tuple[PoolName, Sequence[str]]] = []
        if skip:
            written = [(t.name, t.keys) for _, t in batch.transfers if t.name in skip]
        num_pages = 0
        for name, part in parts.items():
            num_pages += len(part.keys)
            written.extend(zip([name] * len(part.hashes), part.hashes))
        self._inflight[batch.ticket] = Offload(
            ticket=batch.ticket, nodes=batch.nodes, num_bytes=batch.num_bytes,
            num_pages=num_pages, written=written, ready=ready, hashes=queued)
        self._stats["offload_batches"] += 1

    def _side_stream(self) -> Any:
        """CUDA: the side stream offload gathers run on (made once)."""
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.cache.device)
        return self._stream

    # ---------------------------------------------------------------- completions and marks

    def finish(self, done: Completion) -> None:
        """Record every page of a finished offload stored, when every rank's write
        succeeded (its nodes and their split fragments are stored by those pages); either
        way its pages are no longer in flight, so a failed one is retried on a later hit."""
        offload = self._inflight.pop(self._tickets.pop(done.job_id))
        self._inflight_bytes -= offload.num_bytes
        ok = done.ok if self.world_size == 1 else self.ranks.all_ok(done.ok)
        events = getattr(self.cache, "kv_events", None)
        if ok:
            self._stats["offloaded_pages"] += offload.num_pages
            self._stats["offloaded_bytes"] += done.num_bytes
            now = time.monotonic()
            for name, hashes in offload.written:
                self.stored.add(name, hashes, at=now)
            if events is not None:
                for node in _covered(offload):
                    events.emit_node("stored", "store", node)
        else:
            self._stats["failures_offload"] += 1
        for hashes in offload.hashes:
            self.stored.clear_inflight(hashes, offload.ticket)

    def abandon(self) -> None:
        """The linker closed with offloads still in flight (their completions are never
        applied): their pages are no longer in flight, and none is recorded stored."""
        for offload in self._inflight.values():
            for hashes in offload.hashes:
                self.stored.clear_inflight(hashes, offload.ticket)
        self._inflight.clear()
        self._tickets.clear()
        self._inflight_bytes = 0

    def _revalidate(self, node: Any) -> None:
        """Re-check stale stored marks on ``node``'s path (``Revalidation``); pages the store
        lost leave the index, and so are offloaded again by the trigger that follows."""
        self.revalidation.run(node, _namespace_of(node), getattr(self.cache, "kv_events", None))

    def _page_keys(self, node: Any, namespace: Any
                   ) -> tuple[list[str], list[tuple[PoolName, str]]]:
        """The store keys of ``node``'s pages, with (pool, page hash) per key."""
        keys: list[str] = []
        pages: list[tuple[PoolName, str]] = []
        keyspace = self.parts.keyspace
        for component in self.cache.components:
            transfer = component.build_external_linker_transfer(_OFFLOAD, node, node.hash_value)
            if transfer is not None:
                keys.extend(keyspace.keys(transfer.name, transfer.keys, namespace))
                pages.extend((transfer.name, h) for h in transfer.keys)
        return keys, pages

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self._stats)
        out["inflight_offload_bytes"] = self._inflight_bytes
        out.update(self.stored.stats())
        out["codec_misses"] = self.parts.codec_misses()
        return out


def _covered(offload: Offload) -> list[Any]:
    """The nodes still in the tree that ``offload`` covered, split fragments above them
    included (a fragment carries the offload's ticket until it finishes)."""
    seen: dict[int, Any] = {}
    for node in offload.nodes:
        while node.parent is not None and id(node) not in seen and (
                node.offload_inflight == offload.ticket):
            seen[id(node)] = node
            node = node.parent
    return sorted(seen.values(), key=lambda n: n.seq_len)


def _namespace_of(node: Any) -> Any:
    """The namespace of ``node``'s tree: its root's (a request namespace, or the cache's)."""
    while node.parent is not None:
        node = node.parent
    return node.namespace
