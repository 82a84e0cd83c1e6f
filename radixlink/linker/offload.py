"""The offload side of the linker: write policies, the in-flight byte budget, stored marks and
their revalidation (DESIGN.md section 5b, "Offload").

Owns when nodes are exported and how their marks change. Must not free or allocate slots:
page data is copied out synchronously, the store write runs on the linker's worker.
"""

from __future__ import annotations

import enum
import time
from collections import Counter
from typing import Any

from radixlink.contract import InsertParams, LinkerTransferPhase, PoolName
from radixlink.linker.records import (
    Offload,
    pool_fingerprint,
    pool_page_bytes,
    pool_payloads,
    pool_replicated,
)
from radixlink.linker.worker import Completion, PoolPages, TransferKind
from radixlink.stores.codec import PageCodec


class WritePolicy(str, enum.Enum):
    """When nodes are exported: on their first hit (the creating insert counts), on their
    N-th hit, or just before eviction frees their data."""

    WRITE_THROUGH = "write_through"
    WRITE_THROUGH_SELECTIVE = "write_through_selective"
    WRITE_BACK = "write_back"


WRITE_POLICIES = tuple(policy.value for policy in WritePolicy)


class OffloadPolicy:
    """Decides which nodes go to the store and tracks them until the store confirms.

    Args:
        linker: the owning ``ExternalCacheLinker`` (store keys, worker, ranks, counters).
        write_policy: one of ``WRITE_POLICIES``.
        threshold: hits before a ``write_through_selective`` offload (``write_through``
            uses 1: a node's creating insert counts as its first hit).
        max_inflight_bytes: bytes of offloads in flight before new ones are dropped.
        revalidate_after_s: age after which a stored mark is re-checked on a hit.
    """

    def __init__(self, linker: Any, *, write_policy: WritePolicy | str, threshold: int,
                 max_inflight_bytes: int, revalidate_after_s: float):
        try:
            write_policy = WritePolicy(write_policy)
        except ValueError:
            raise ValueError(f"write_policy must be one of {WRITE_POLICIES}, got "
                             f"{write_policy!r}") from None
        if not isinstance(threshold, int) or threshold < 1:
            raise ValueError(f"write_through_threshold must be an int >= 1, got {threshold!r}")
        if max_inflight_bytes <= 0:
            raise ValueError(f"max_inflight_bytes must be positive, got {max_inflight_bytes}")
        self.linker = linker
        self.write_policy = write_policy
        self.threshold = 1 if write_policy is WritePolicy.WRITE_THROUGH else threshold
        self.max_inflight_bytes = max_inflight_bytes
        self.revalidate_after_s = revalidate_after_s
        self._codecs: dict[PoolName, PageCodec] = {}
        self._inflight: dict[int, Offload] = {}  # ticket -> offload
        self._tickets: dict[int, int] = {}  # worker job id -> ticket
        self._inflight_bytes = 0
        self._next_ticket = 0
        self._stats: Counter[str] = Counter()

    # ---------------------------------------------------------------- pools

    def codec(self, name: PoolName) -> PageCodec:
        codec = self._codecs.get(name)
        if codec is None:
            pool = self.linker.cache.pool(name)
            if pool is None:
                raise ValueError(f"the cache has no {name.value} pool; build it with a layout")
            codec = PageCodec(pool_fingerprint(pool, name), pool_page_bytes(pool),
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
        """write_back: export ``node`` (and unstored ancestors) before eviction frees any of
        its data (its full KV, or only its SWA window or state while the node stays)."""
        if self.write_policy is WritePolicy.WRITE_BACK and not node.external_cache_stored:
            self.offload_chain(self.linker.cache.tree.backup_chain(node))

    def on_split(self, parent: Any, child: Any) -> None:
        """A node in flight was split: its new front fragment belongs to the same offload
        (resolved through the record, so an eviction of the child cannot orphan it)."""
        ticket = parent.offload_inflight
        if ticket:
            self._inflight[ticket].nodes.append(parent)

    def offload_chain(self, chain: list[Any]) -> bool:
        """Copy out and queue the pages of ``chain`` (ancestors first) in one store write.

        Returns False when nothing was queued (nothing to write, or over the byte budget).
        """
        if not chain:
            return False
        pools: dict[PoolName, tuple[list[str], list[Any]]] = {}
        num_pages, num_bytes, namespace = 0, 0, _namespace_of(chain[0])
        for node in chain:
            for component in self.linker.cache.components:
                transfer = component.build_external_linker_transfer(
                    LinkerTransferPhase.OFFLOAD, node, node.hash_value)
                if transfer is None:
                    continue
                pool = self.linker.cache.pool(transfer.name)
                # NOTE: counted on every rank, written or not, so the budget decides alike
                num_bytes += len(transfer.keys) * pool_page_bytes(pool)
                num_pages += len(transfer.keys)
                if self.replicated(transfer.name) and self.linker.ranks.rank != 0:
                    continue  # NOTE: identical bytes on every rank are written by rank 0 only
                keys, payloads = pools.setdefault(transfer.name, ([], []))
                keys.extend(self.linker.store_keys(transfer, namespace))
                payloads.extend(pool_payloads(pool, transfer))
        if self._inflight_bytes + num_bytes > self.max_inflight_bytes:
            self._stats["dropped_offloads"] += 1
            return False
        self._next_ticket += 1
        ticket = self._next_ticket
        for node in chain:
            node.offload_inflight = ticket
        job = [PoolPages(keys=keys, codec=self.codec(name), payloads=payloads)
               for name, (keys, payloads) in pools.items()]
        job_id = self.linker.submit(TransferKind.OFFLOAD, job)
        self._tickets[job_id] = ticket
        self._inflight[ticket] = Offload(ticket=ticket, nodes=list(chain), num_bytes=num_bytes,
                                         num_pages=num_pages)
        self._inflight_bytes += num_bytes
        self._stats["offloads"] += 1
        return True

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

    def mark_loaded(self, last_node: Any, prefix_len: int) -> None:
        """Pages just loaded from the store are in the store: mark the nodes they cover
        whole (a node starting below ``prefix_len`` also holds device pages nobody checked)."""
        now, node = time.monotonic(), last_node
        while node.parent is not None and node.seq_len - node.num_tokens >= prefix_len:
            node.external_cache_stored = True
            node.stored_at = now
            node = node.parent

    def _revalidate(self, node: Any) -> None:
        """Re-check, with one presence call, stale stored marks on ``node``'s path; pages the
        store lost are unmarked (and so offloaded again by the trigger that follows)."""
        limit = time.monotonic() - self.revalidate_after_s
        stale = []
        while node.parent is not None:
            if node.external_cache_stored and (node.stored_at or 0.0) <= limit:
                stale.append(node)
            node = node.parent
        if not stale:
            return
        keys_per_node, namespace = [], _namespace_of(stale[0])
        for item in stale:
            keys: list[str] = []
            for component in self.linker.cache.components:
                transfer = component.build_external_linker_transfer(
                    LinkerTransferPhase.OFFLOAD, item, item.hash_value)
                if transfer is not None:
                    keys.extend(self.linker.store_keys(transfer, namespace))
            keys_per_node.append(keys)
        present = self.linker.guard.exists([k for keys in keys_per_node for k in keys])
        if present is None:  # failed, slow or skipped (breaker open): check again next hit
            self._stats["failures_revalidate"] += 1
            return
        self._stats["revalidations"] += 1
        pos, now = 0, time.monotonic()
        events = getattr(self.linker.cache, "kv_events", None)
        for item, keys in zip(stale, keys_per_node):
            if all(present[pos : pos + len(keys)]):
                item.stored_at = now
            else:
                item.external_cache_stored = False
                item.stored_at = None
                self._stats["lost_nodes"] += 1
                if events is not None:
                    events.emit_node("removed", "store", item)
            pos += len(keys)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self._stats)
        out["inflight_offload_bytes"] = self._inflight_bytes
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
