"""Revalidation of stored marks (DESIGN.md section 5b, "Offload" and "Ranks decide alike"):
stale marks on a hit node's path (their pages' confirmation in the stored index is older than
the age) are re-checked with one presence call; the pages of nodes the store lost leave the
index, so the write policy offloads them again; the pages of nodes it still holds are
confirmed again.

Owns the verdict on each mark. Must not submit jobs or touch slots. With several ranks the
verdict is agreed (one MIN all-reduce per insert whose path holds a stored mark): every rank
forgets the same nodes' pages, so every rank re-offloads the same chain and their collectives
pair.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from radixlink.contract import PoolName
from radixlink.tree.stored import StoredPages

# Verdicts, ordered for a MIN over ranks: one rank that lost a page decides for all.
LOST, PRESENT, NO_OPINION = 0, 1, 2

PageKeys = Callable[[Any, Any], tuple[list[str], list[tuple[PoolName, str]]]]
"""``(node, namespace) -> (store keys, (pool, page hash) per key)`` of a node's pages."""


class Revalidation:
    """Re-checks stale stored marks on a node's path.

    Args:
        ranks: the rank group (agreement with several ranks).
        guard: the linker's ``StoreGuard`` (presence under the time budget and breaker).
        stored: the stored index (the verdicts are applied to it).
        page_keys: a node's store keys and pages (``PageKeys``).
        max_age_s: a mark older than this is re-checked (``revalidate_after_s``).
        stats: the offload counters (``revalidations``, ``failures_revalidate``,
            ``lost_nodes``).
    """

    def __init__(self, ranks: Any, guard: Any, stored: StoredPages, page_keys: PageKeys,
                 max_age_s: float, stats: Counter[str]):
        self.ranks, self.guard, self.stored = ranks, guard, stored
        self.world_size = ranks.world_size
        self.page_keys, self.max_age_s, self._stats = page_keys, max_age_s, stats

    def run(self, node: Any, namespace: Any, events: Any = None) -> None:
        """Re-check the stale marks on ``node``'s path; unmark nodes the store lost.

        One rank: a presence call when a mark is stale. Several ranks: a collective whenever
        the path holds a stored mark (the marks agree on every rank, so the call count
        does), and each node's verdict is the MIN over ranks: a rank whose mark is fresh, or
        whose store call failed, has no opinion; a rank that found a page missing unmarks the
        node on all.
        """
        if self.world_size == 1:
            stale = self._stale_path(node)
            if stale:
                local = self._check(stale, namespace)
                self._apply(stale, [local.get(id(item), NO_OPINION) for item in stale], local,
                            namespace, events)
            return
        stored, stamps = [], []
        while node.parent is not None:
            at = node.stored_at  # NOTE: None unless stored: one index read per node, not two
            if at is not None:
                stored.append(node)
                stamps.append(at)
            node = node.parent
        if not stored:  # NOTE: the index is agreed (docs/linker.md, Ranks): skipped on all or none
            return
        limit = time.monotonic() - self.max_age_s
        local = self._check([item for item, at in zip(stored, stamps, strict=True)
                             if at <= limit], namespace)
        verdicts = self.ranks.all_reduce_min([local.get(id(item), NO_OPINION)
                                              for item in stored])
        self._apply(stored, verdicts, local, namespace, events)

    def _stale_path(self, node: Any) -> list[Any]:
        """The nodes on ``node``'s path whose stored mark is stale (one rank).

        A node found fresh keeps until when it stays so (``TreeNode.stored_fresh``, valid in
        the index's epoch), and is not read again before then: a hit costs a few attribute
        reads per node instead of one index read per page. Confirmations only move forward
        within an epoch, so a node fresh until then is fresh at least that long.
        """
        now = time.monotonic()
        limit, epoch, age = now - self.max_age_s, self.stored.epoch, self.max_age_s
        stale = []
        while node.parent is not None:
            memo = node.stored_fresh
            if memo[0] != epoch or memo[1] <= now:
                at = node.stored_at
                if at is not None:
                    if at <= limit:
                        stale.append(node)
                    else:
                        node.stored_fresh = (epoch, at + age)
            node = node.parent
        return stale

    def _apply(self, nodes: list[Any], verdicts: list[int], local: dict[int, int],
               namespace: Any, events: Any) -> None:
        """Unmark the nodes found lost (every pool's pages leave the index); confirm again the
        pages of those this rank itself saw present."""
        now = time.monotonic()
        for item, verdict in zip(nodes, verdicts, strict=True):
            if verdict == LOST:  # NOTE: every pool's pages of it are written again
                for name, page in self.page_keys(item, namespace)[1]:
                    self.stored.discard(name, (page,))
                item.external_cache_stored = False  # its backbone pages, offloaded or not
                self._stats["lost_nodes"] += 1
                if events is not None:
                    events.emit_node("removed", "store", item)
            elif verdict == PRESENT and local.get(id(item)) == PRESENT:
                # NOTE: only where this rank itself saw its pages (a time, not membership)
                for name, page in self.page_keys(item, namespace)[1]:
                    self.stored.refresh(name, (page,), now)

    def _check(self, stale: list[Any], namespace: Any) -> dict[int, int]:
        """This rank's verdict per stale node (by ``id``), from one presence call; empty when
        the call failed, was slow or skipped (the breaker is open): check again next hit."""
        if not stale:
            return {}
        per_node = [self.page_keys(item, namespace) for item in stale]
        present = self.guard.exists([k for keys, _ in per_node for k in keys])
        if present is None:
            self._stats["failures_revalidate"] += 1
            return {}
        self._stats["revalidations"] += 1
        out, pos = {}, 0
        for item, (keys, _) in zip(stale, per_node, strict=True):
            found = present[pos : pos + len(keys)]
            pos += len(keys)
            out[id(item)] = PRESENT if all(found) else LOST
        return out
