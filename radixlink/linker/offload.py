"""The offload side of the linker: write policies, the in-flight byte budget, stored marks, the
record of pages known to be stored, and revalidation (DESIGN.md section 5b, "Offload").

Owns when nodes are exported and how their marks change. Must not free or allocate slots:
page data is gathered into staging synchronously (queued on a side stream on CUDA); encoding
and the store write run on the linker's worker.
"""

from __future__ import annotations

import enum
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import torch

from radixlink.contract import InsertParams, LinkerTransferPhase, PoolName, PoolTransfer
from radixlink.linker.jobs import Batch, offload_job, select_pages
from radixlink.linker.known import KnownPages
from radixlink.linker.records import Offload, pool_fingerprint, pool_page_bytes, pool_replicated
from radixlink.linker.revalidate import Revalidation
from radixlink.linker.worker import Completion
from radixlink.stores.pageio import Codec, make_codec

if TYPE_CHECKING:  # NOTE: config imports WritePolicy from here
    from radixlink.linker.config import LinkerConfig

_OFFLOAD = LinkerTransferPhase.OFFLOAD


class WritePolicy(str, enum.Enum):
    """When nodes are exported: on their first hit (the creating insert counts), on their
    N-th hit, or just before eviction frees their data."""

    WRITE_THROUGH = "write_through"
    WRITE_THROUGH_SELECTIVE = "write_through_selective"
    WRITE_BACK = "write_back"


WRITE_POLICIES = tuple(policy.value for policy in WritePolicy)


class OffloadPolicy:
    """Decides which nodes go to the store and tracks them until the store confirms.

    Offloads queue on the engine thread and go to the worker as one batch (one gather into
    one staging buffer, one job, one store ``put``). An offload goes out at once when none
    went out in the last ``batch_window_s``; otherwise it waits for company until the next
    offload after the window, ``batch_pages`` waiting pages, the linker's next ``poll`` /
    ``wait_load`` / ``flush``, or an eviction that would free a queued node's data. Under a
    stream of inserts that leaves a few list appends per insert and, per batch, one gather
    per pool and one thread handoff; a lone insert is not delayed.

    Args:
        linker: the owning ``ExternalCacheLinker`` (store keys, worker, ranks, counters).
        config: the linker's validated ``LinkerConfig``; this uses ``write_policy``,
            ``write_through_threshold`` (hits before a ``write_through_selective`` offload;
            ``write_through`` uses 1: a node's creating insert counts as its first hit),
            ``max_inflight_bytes`` (queued or in flight before new offloads are dropped),
            ``revalidate_after_s`` (age after which a stored mark is re-checked on a hit; also
            how long the record of known pages trusts a confirmation) and ``max_known_pages``
            (0: off; with several ranks it is off, since ranks would remember different pages).
        batch_pages: queued pages that send a batch at once.
        batch_window_s: offloads within this long after a batch went out wait for company.
    """

    def __init__(self, linker: Any, config: LinkerConfig, *, batch_pages: int = 512,
                 batch_window_s: float = 0.005):
        self.linker = linker
        self.write_policy = write_policy = config.write_policy
        self.threshold = (1 if write_policy is WritePolicy.WRITE_THROUGH
                          else config.write_through_threshold)
        self.max_inflight_bytes = config.max_inflight_bytes
        self.revalidate_after_s = revalidate_after_s = config.revalidate_after_s
        # NOTE: a clock would batch differently on each rank, and ranks must submit the same
        # jobs in the same order: with several ranks every offload goes out at once.
        self.batch_pages = batch_pages
        self.batch_window_s = batch_window_s if linker.ranks.world_size == 1 else 0.0
        self._last_sent = -float("inf")
        # NOTE: rank-local knowledge would let ranks write different pages and so submit
        # different jobs, which the rank agreement of completions cannot allow. A zero
        # revalidation age trusts no mark, so nothing is remembered either.
        trusted = linker.ranks.world_size == 1 and revalidate_after_s > 0
        self.known = KnownPages(config.max_known_pages if trusted else 0,
                                revalidate_after_s or 1.0)
        self._codecs: dict[PoolName, Codec] = {}
        self._page_bytes: dict[PoolName, int] = {}
        self._inflight: dict[int, Offload] = {}  # ticket -> offload
        self._tickets: dict[int, int] = {}  # worker job id -> ticket
        self._inflight_bytes = 0
        self._next_ticket = 0
        self._batch: Batch | None = None
        self._stream: Any = None  # CUDA: the side stream offload gathers run on
        self._stats: Counter[str] = Counter()
        self.revalidation = Revalidation(linker.ranks, linker.guard, self.known, self._page_keys,
                                         revalidate_after_s, self._stats)

    # ---------------------------------------------------------------- pools

    def codec(self, name: PoolName) -> Codec:
        codec = self._codecs.get(name)
        if codec is None:
            pool = self.linker.cache.pool(name)
            if pool is None:
                raise ValueError(f"the cache has no {name.value} pool; build it with a layout")
            codec = make_codec(pool_fingerprint(pool, name), pool_page_bytes(pool),
                               secret=self.linker.store.page_secret)
            self._codecs[name] = codec
        return codec

    def replicated(self, name: PoolName) -> bool:
        pool = self.linker.cache.pool(name)
        return pool is not None and pool_replicated(pool)

    def jobs(self) -> list[int]:
        return list(self._tickets)

    # ---------------------------------------------------------------- triggers

    def on_insert(self, params: InsertParams, result: Any) -> None:
        """Count the insert's hit and offload the deepest node that reached the threshold."""
        node = result.last_node
        if params.chunked or node is None or node.parent is None:
            return
        if result.prefix_len < node.seq_len:
            node.hit_count += 1  # NOTE: the creating insert counts as the new leaf's first hit
        self._revalidate(node)
        if self.write_policy is WritePolicy.WRITE_BACK:
            return
        while node.parent is not None and node.hit_count < self.threshold:
            node = node.parent
        if node.parent is not None:
            self.offload_chain(self.linker.cache.tree.backup_chain(node))

    def before_evict(self, node: Any) -> None:
        """Eviction is about to free some of ``node``'s data: a queued batch is gathered now
        (on CUDA a queued gather of ``node`` finishes first); write_back exports ``node``
        (and unstored ancestors) first."""
        ticket = node.offload_inflight
        if ticket:
            if self._batch is not None and self._batch.ticket == ticket:
                self.flush_batch()
            offload = self._inflight.get(ticket)
            if offload is not None and offload.ready is not None:
                offload.ready.synchronize()
        if self.write_policy is WritePolicy.WRITE_BACK and not node.external_cache_stored:
            if self.offload_chain(self.linker.cache.tree.backup_chain(node)):
                self.flush_batch()

    def on_split(self, parent: Any, child: Any) -> None:
        """A node queued or in flight was split: its new front fragment belongs to the same
        offload (its pages were captured whole, so only the marks follow)."""
        ticket = parent.offload_inflight
        if not ticket:
            return
        if self._batch is not None and self._batch.ticket == ticket:
            self._batch.nodes.append(parent)
        else:
            self._inflight[ticket].nodes.append(parent)

    def offload_chain(self, chain: list[Any]) -> bool:
        """Queue the pages of ``chain`` (ancestors first) for the next batch; the batch goes
        out at once when ``batch_pages`` pages wait.

        Returns False when nothing was queued (nothing to write, or over the byte budget).
        """
        if not chain:
            return False
        cache, namespace = self.linker.cache, _namespace_of(chain[0])
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
                    page_bytes = self._page_bytes[transfer.name] = pool_page_bytes(
                        cache.pool(transfer.name))
                num_bytes += len(transfer.keys) * page_bytes
                num_pages += len(transfer.keys)
                transfers.append((namespace, transfer))
        if self._inflight_bytes + num_bytes > self.max_inflight_bytes:
            self._stats["dropped_offloads"] += 1
            return False
        batch = self._batch
        if batch is None:
            self._next_ticket += 1
            batch = self._batch = Batch(self._next_ticket)
        for node in chain:
            node.offload_inflight = batch.ticket
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
        one staging buffer, as one worker job. Nodes whose every page is known to be stored
        are marked stored at once."""
        batch, self._batch = self._batch, None
        if batch is None:
            return
        self._last_sent = time.monotonic()
        skip = {t.name for _, t in batch.transfers
                if self.replicated(t.name) and self.linker.ranks.rank != 0}
        parts, oldest = select_pages(batch, self.linker.cache, self.linker.keyspace,
                                     self.known, skip)
        # NOTE: with several ranks a rank with nothing to write (replicated pools on rank > 0)
        # still submits its (empty) job: every rank must submit the same jobs.
        if not parts and self.linker.ranks.world_size == 1:  # all known: mark, write nothing
            self._inflight_bytes -= batch.num_bytes
            self._mark(batch.nodes, batch.ticket, oldest)
            return
        job, ready = offload_job(parts, self.linker.cache, self.codec, self.linker.arena,
                                 self._side_stream())
        job_id = self.linker.submit(job)
        self._tickets[job_id] = batch.ticket
        written = [(name, hashes) for name, part in parts.items() for hashes in part.hashes]
        # NOTE: known from now on, so later batches skip them while this one is in flight
        # (slow stores); a failed write forgets them again.
        for name, hashes in written:
            self.known.add(name, hashes)
        self._inflight[batch.ticket] = Offload(
            ticket=batch.ticket, nodes=batch.nodes, num_bytes=batch.num_bytes,
            num_pages=sum(len(part.keys) for part in parts.values()), written=written,
            ready=ready)
        self._stats["offload_batches"] += 1

    def _side_stream(self) -> Any:
        device = self.linker.cache.device
        if device.type != "cuda":
            return None
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        return self._stream

    def _mark(self, nodes: list[Any], ticket: int, stored_at: float | None) -> None:
        """Mark the nodes of an offload that wrote nothing (every page known) stored; their
        mark ages from the record's, so revalidation still comes in time."""
        for node in nodes:
            if node.offload_inflight != ticket:
                continue
            node.offload_inflight = 0
            if node.seq_len >= 0 and stored_at is not None:
                node.external_cache_stored = True
                node.stored_at = stored_at
        self._stats["known_offloads"] += 1

    # ---------------------------------------------------------------- completions and marks

    def finish(self, done: Completion) -> None:
        """Mark every node (and split fragment) of a finished offload stored, when every rank's
        write succeeded; otherwise clear the in-flight mark so a later hit retries."""
        offload = self._inflight.pop(self._tickets.pop(done.job_id))
        self._inflight_bytes -= offload.num_bytes
        ok = self.linker.ranks.all_ok(done.ok)
        if ok:
            self._stats["offloaded_pages"] += offload.num_pages
            self._stats["offloaded_bytes"] += done.num_bytes
        else:
            for name, hashes in offload.written:
                self.known.discard(name, hashes)
            self._stats["failures_offload"] += 1
        now, events = time.monotonic(), getattr(self.linker.cache, "kv_events", None)
        for node in offload.nodes:  # split fragments were added by on_split
            if node.offload_inflight != offload.ticket:
                continue
            node.offload_inflight = 0
            if ok and events is not None:
                events.emit_node("stored", "store", node)
            if ok and node.seq_len >= 0:
                node.external_cache_stored = True
                node.stored_at = now

    def abandon(self) -> None:
        """The linker closed with offloads still in flight (their completions are never
        applied): clear their nodes' in-flight marks and forget their pages as known."""
        for offload in self._inflight.values():
            for name, hashes in offload.written:
                self.known.discard(name, hashes)
            for node in offload.nodes:
                if node.offload_inflight == offload.ticket:
                    node.offload_inflight = 0
        self._inflight.clear()
        self._tickets.clear()
        self._inflight_bytes = 0

    def mark_loaded(self, last_node: Any, prefix_len: int,
                    transfers: list[PoolTransfer | None]) -> None:
        """Pages just loaded from the store are in the store: remember the pages of
        ``transfers`` and mark the nodes they cover whole (a node starting below
        ``prefix_len`` also holds device pages nobody checked)."""
        for transfer in transfers:
            if transfer is not None:
                self.known.add(transfer.name, transfer.keys)
        now, node = time.monotonic(), last_node
        while node.parent is not None and node.seq_len - node.num_tokens >= prefix_len:
            node.external_cache_stored = True
            node.stored_at = now
            node = node.parent

    def forget_absent(self, transfers: list[PoolTransfer], exists: list[bool]) -> None:
        """A presence check (a LOOKUP) found some of ``transfers``' pages absent: the store
        evicted them, so the record must not keep them known (they are written again)."""
        if not self.known.enabled or all(exists):
            return
        pos = 0
        for transfer in transfers:
            found = exists[pos : pos + len(transfer.keys)]
            pos += len(transfer.keys)
            if not all(found):
                gone = [h for h, hit in zip(transfer.keys, found) if not hit]
                self.known.discard(transfer.name, gone)

    def _revalidate(self, node: Any) -> None:
        """Re-check stale stored marks on ``node``'s path (``Revalidation``); pages the store
        lost are unmarked, and so offloaded again by the trigger that follows."""
        self.revalidation.run(node, _namespace_of(node),
                              getattr(self.linker.cache, "kv_events", None))

    def _page_keys(self, node: Any, namespace: Any
                   ) -> tuple[list[str], list[tuple[PoolName, str]]]:
        """The store keys of ``node``'s pages, with (pool, page hash) per key."""
        keys: list[str] = []
        pages: list[tuple[PoolName, str]] = []
        for component in self.linker.cache.components:
            transfer = component.build_external_linker_transfer(_OFFLOAD, node, node.hash_value)
            if transfer is not None:
                keys.extend(self.linker.keyspace.keys(transfer.name, namespace, transfer.keys))
                pages.extend((transfer.name, h) for h in transfer.keys)
        return keys, pages

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self._stats)
        out["inflight_offload_bytes"] = self._inflight_bytes
        out.update(self.known.stats())
        misses: Counter[str] = Counter()
        for codec in self._codecs.values():
            misses.update({k: v for k, v in codec.stats().items() if k not in ("encoded",
                                                                               "decoded")})
        out["codec_misses"] = dict(misses)
        return out


def _namespace_of(node: Any) -> Any:
    """The namespace of ``node``'s tree: its root's (a request namespace, or the cache's)."""
    while node.parent is not None:
        node = node.parent
    return node.namespace
