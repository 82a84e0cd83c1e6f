"""The scheduler-side half of the connector: store lookups, load plans, and which computed pages
each step saves.

Owns per-request bookkeeping in the scheduler process. Must not touch KV tensors (workers own
them) or vLLM's block manager beyond the block ids vLLM hands it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from radixlink.contract import PoolHitPolicy
from radixlink.errors import StoreError
from radixlink.integrations.vllm.events import StoreEvents
from radixlink.integrations.vllm.keys import GroupLayout, KeyScheme
from radixlink.integrations.vllm.metadata import GroupPages, PageJob, RadixlinkMetadata
from radixlink.integrations.vllm.names import PageNames
from radixlink.pages import pageio
from radixlink.pages.restore import PoolRule, largest_common, restorable, stored_past
from radixlink.stores.base import Store

_ALL, _TRAILING = PoolHitPolicy.ALL_PAGES, PoolHitPolicy.TRAILING_PAGES

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Loading:
    """A load in flight: where it starts, its pages, and its block ids."""

    local: int  # pages vLLM had on device before it
    num_pages: int  # pages it loads (counted external by vLLM)
    first_group: tuple[int, ...]  # the first group's block ids, in page order
    block_ids: frozenset[int]  # every group's


class SchedulerSide:
    """Lookups and save plans for one vLLM scheduler.

    Page counting (one page = one block of every group)::

        tokens  | local hit (device)  | store hit (loaded)  | computed here ...   |
        pages   0 ............ local  local ........ local+hit               ...
        saved   (by whoever computed) (already stored)     saved as computed

    Args:
        layouts: the groups taking part (empty: the connector does nothing).
        scheme: key naming shared with the workers.
        store: the page store (only ``exists`` is called here, once per lookup).
        tp_size: tensor-parallel ranks; a page counts only when every rank's key is present.
        load: whether lookups may report hits.
        save: whether computed pages are planned for saving.
        events: told of every planned load and save (their pages' KV events), or None.
    """

    def __init__(self, *, layouts: Sequence[GroupLayout], scheme: KeyScheme, store: Store,
                 tp_size: int, load: bool, save: bool,
                 events: StoreEvents | None = None):  # fmt: skip
        self._layouts = tuple(layouts)
        self.events = events  # KV events (vLLM's --kv-events-config), or None
        self._scheme = scheme
        self.store = store
        self._tp_size = tp_size
        self._load = load and bool(layouts)
        self._save = save and bool(layouts)
        self._block_size = layouts[0].block_size if layouts else 0
        self._null_block_id = 0
        self._requests: dict[str, Any] = {}
        self._lookups: dict[str, tuple[int, int]] = {}  # req -> (local pages, hit pages)
        self._saved: dict[str, int] = {}  # req -> leading pages stored (or skipped)
        self._names: dict[str, PageNames] = {}  # req -> page hashes known so far
        self._all_pages = all(g.window_pages == 0 for g in self._layouts)
        self._rules = [PoolRule(g.pool, _TRAILING if g.window_pages else _ALL, g.window_pages)
                       for g in self._layouts]  # fmt: skip
        self._loading: dict[str, _Loading] = {}
        self._load_failed: set[str] = set()  # requests whose load failed: no store hit again
        self._behind_hole: set[str] = set()  # pages stored past a missing one: never verified
        self._loads: list[PageJob] = []
        self._finishing: list[PageJob] = []
        self.num_lookups = 0
        self.num_hit_pages = 0
        self.num_store_errors = 0
        self.num_unloaded_tokens = 0  # counted external by vLLM, then recomputed
        self._reported = (0, 0, 0, 0)

    def set_null_block_id(self, block_id: int) -> None:
        """The id of vLLM's null block (SWA blocks outside the window point at it)."""
        self._null_block_id = block_id

    def add_request(self, request: Any) -> None:
        """Remember a new request (its hashes and token counts are read at each step)."""
        self._requests[request.request_id] = request

    def may_load(self, request: Any) -> bool:
        """Whether a lookup of ``request`` may report a store hit, without asking the store
        (vLLM 0.34's ``may_load_async``: such requests may start loading while the running
        batch is full). False when loads are off, the request's load failed before (never
        offered a hit again), or it has no whole page before its last token (one is always
        computed); else True: a miss found by the lookup costs that lookup and holds back
        vLLM's other async loads for the step, as vLLM's default (no early loads) would."""
        return (self._load and request.request_id not in self._load_failed
                and request.num_tokens - 1 >= self._block_size)  # fmt: skip

    def lookup(self, request: Any, num_computed_tokens: int) -> int:
        """Tokens past ``num_computed_tokens`` (block aligned) every rank can load; one batched
        ``exists`` over all groups and ranks. A store error is a miss."""
        self._requests[request.request_id] = request
        size = self._block_size
        local = num_computed_tokens // size if size else 0
        self._lookups[request.request_id] = (local, 0)
        if not self._load or request.request_id in self._load_failed:
            return 0
        # NOTE: keep one token to compute, as vLLM's own prefix cache does.
        tail = self._page_hashes(request, (request.num_tokens - 1) // size)[local:]
        if not tail:
            return 0
        salt = request.cache_salt or ""
        flat: list[str] = []
        for rank in range(self._tp_size):
            for layout in self._layouts:
                flat += self._scheme.keys(layout, tail, rank, salt)
        self.num_lookups += 1
        try:
            present = pageio.present(self.store, flat)
        except StoreError as exc:
            self.num_store_errors += 1
            logger.warning("radixlink lookup failed, treating as a miss: %s", exc)
            return 0
        hit = self._hit(present, len(tail))
        self._lookups[request.request_id] = (local, hit)
        self.num_hit_pages += hit
        if stored_past(present, len(tail), hit + 1):
            # NOTE: heal in one pass: pages after a missing one are never read, so they may
            # be damaged too; the request recomputes them, and its saves overwrite them.
            self._behind_hole.add(request.request_id)
        return hit * size

    def plan_load(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """After vLLM allocated blocks for an async load: queue the load for the workers."""
        req_id = request.request_id
        local, _ = self._lookups.pop(req_id, (0, 0))
        # NOTE: pages of vLLM's own prefix cache were saved by the request that computed them
        self._saved[req_id] = max(self._saved.get(req_id, 0), local)
        if num_external_tokens <= 0 or not self._load:
            return
        num_pages = num_external_tokens // self._block_size
        hashes = self._page_hashes(request, local + num_pages)[local:]
        job = self._job(request, blocks.get_block_ids(), local, hashes, finishing=False)
        self._loads.append(job)
        groups = job.groups
        self._loading[req_id] = _Loading(
            local=local, num_pages=len(hashes), first_group=groups[0].block_ids,
            block_ids=frozenset(groups[0].block_ids).union(*(g.block_ids for g in groups[1:])),
        )  # fmt: skip
        self._saved[req_id] = max(self._saved[req_id], local + len(hashes))

    def build_meta(self, scheduler_output: Any) -> RadixlinkMetadata:
        """This step's loads, plus saves of every page that becomes computed in it."""
        meta = RadixlinkMetadata(loads=self._loads, saves=self._finishing)
        self._loads, self._finishing = [], []
        if not self._save:
            return meta
        block_state = scheduler_output.kv_connector_block_state
        for req_id, num_scheduled in scheduler_output.num_scheduled_tokens.items():
            request = self._requests.get(req_id)
            if request is None or block_state is None:
                continue
            done = request.num_computed_tokens
            # NOTE: prompt tokens are final once scheduled; output tokens only once their
            # step was processed (spec-decode drafts may be rejected), hence the two bounds.
            processed = done - getattr(request, "num_in_flight_tokens", 0)
            end = max(processed, min(done + num_scheduled, request.num_prompt_tokens))
            job = self._save_job(request, block_state.get_block_ids(req_id), end, False)
            if job is not None:
                meta.saves.append(job)
        return meta

    def finish(self, request: Any, block_ids: tuple[list[int], ...]) -> bool:
        """The request finished: plan a save of its computed pages not saved yet. True when
        vLLM must hold the blocks until the workers report the pages copied out."""
        req_id = request.request_id
        job = None
        # NOTE: not while its load is in flight (an abort): vLLM already holds the blocks
        # until the load reports, and frees them then; a save would free them a second time.
        if self._save and req_id in self._requests and req_id not in self._loading:
            job = self._save_job(request, block_ids, request.num_computed_tokens, True)
        for table in (self._requests, self._lookups, self._saved, self._names, self._loading):
            table.pop(req_id, None)
        self._load_failed.discard(req_id)
        self._behind_hole.discard(req_id)
        if job is None:
            return False
        self._finishing.append(job)
        return True

    def loads_done(self, finished: set[str], failed: set[str], bad_blocks: set[int]) -> None:
        """Loads that ended. A failed one's pages will be recomputed, so they are saved again,
        and the request is not offered a store hit again: vLLM looks a request up afresh when a
        failure sent it back to 0 computed tokens, and the same pages would fail the same way
        (a store that answers ``exists`` but fails ``get`` would loop forever).

        vLLM counted the whole planned load as external tokens at admission; the tokens it
        now recomputes are taken off the request's prefill stats (``prompt_tokens_by_source``)
        and counted in ``num_unloaded_tokens``."""
        for req_id in finished:
            entry = self._loading.pop(req_id, None)
            if entry is None or not (req_id in failed or entry.block_ids & bad_blocks):
                continue
            request = self._requests.get(req_id)
            if request is None:
                continue
            self._load_failed.add(req_id)
            self._saved[req_id] = entry.local
            kept = 0 if req_id in failed else next(
                (i for i, b in enumerate(entry.first_group) if b in bad_blocks), 0)
            unloaded = (entry.num_pages - kept) * self._block_size
            self.num_unloaded_tokens += unloaded
            _uncount_external_tokens(request, unloaded)

    def take_stats(self) -> dict[str, int]:
        """Lookup counters since the last call (the nonzero ones), for vLLM's stats."""
        now = (self.num_lookups, self.num_hit_pages, self.num_store_errors,
               self.num_unloaded_tokens)  # fmt: skip
        names = ("lookups", "hit_pages", "lookup_errors", "unloaded_tokens")
        delta = {n: a - b for n, a, b in zip(names, now, self._reported) if a != b}
        self._reported = now
        return delta

    def page_keys(self, request: Any, num_pages: int, rank: int = 0) -> list[str]:
        """The store keys of the request's first ``num_pages`` pages on ``rank``, group after
        group (for tools and benchmarks; the hot path builds them per lookup)."""
        hashes = self._page_hashes(request, num_pages)
        salt = request.cache_salt or ""
        return [k for layout in self._layouts
                for k in self._scheme.keys(layout, hashes, rank, salt)]  # fmt: skip

    def _save_job(self, request: Any, block_ids: Sequence[Sequence[int]], end_tokens: int,
                  finishing: bool) -> PageJob | None:  # fmt: skip
        req_id = request.request_id
        start = self._saved.get(req_id, 0)
        end = end_tokens // self._block_size
        if end <= start:
            return None
        hashes = self._page_hashes(request, end)[start:]
        self._saved[req_id] = start + len(hashes)
        if not hashes:
            return None
        job = self._job(request, block_ids, start, hashes, finishing=finishing,
                        overwrite=req_id in self._load_failed or req_id in self._behind_hole)
        return job if job.num_pages else None

    def _job(self, request: Any, block_ids: Sequence[Sequence[int]], start: int,
             hashes: list[str], *, finishing: bool,
             overwrite: bool = False) -> PageJob:  # fmt: skip
        groups = []
        null = self._null_block_id
        all_hashes = tuple(hashes)
        for g in self._layouts:
            ids = block_ids[g.group_id][start : start + len(hashes)]
            if null in ids:  # NOTE: SWA blocks out of the window: no page to move
                pairs = [(b, h) for b, h in zip(ids, hashes) if b != null]
                groups.append(GroupPages(group_id=g.group_id, block_ids=tuple(b for b, _ in pairs),
                                         hashes=tuple(h for _, h in pairs)))  # fmt: skip
            else:
                groups.append(GroupPages(group_id=g.group_id, block_ids=tuple(ids),
                                         hashes=all_hashes[: len(ids)]))  # fmt: skip
        job = PageJob(req_id=request.request_id, groups=tuple(groups),
                      cache_salt=request.cache_salt or "", finishing=finishing,
                      overwrite=overwrite)  # fmt: skip
        if self.events is not None:
            self.events.note(request, job, start, hashes)
        return job

    def _page_hashes(self, request: Any, num_pages: int) -> list[str]:
        """The request's first ``num_pages`` page hashes (fewer if not hashed yet), from its
        ``PageNames`` (hashed once, extended as the request grows, checked against vLLM's)."""
        names = self._names.get(request.request_id)
        if names is None:
            names = self._names[request.request_id] = PageNames()
        return names.first(self._scheme, request, self._block_size, num_pages)

    def _hit(self, present: list[bool], num_pages: int) -> int:
        """The longest tail every group and rank can restore (``present``: ``num_pages``
        flags per group and rank, one run after another)."""
        if self._all_pages:  # NOTE: full attention only: the shortest leading run
            runs = (present[i : i + num_pages] for i in range(0, len(present), num_pages))
            return min(run.index(False) if False in run else num_pages for run in runs)
        per_rank = len(self._layouts) * num_pages
        return largest_common([
            restorable(self._rules, present[base : base + per_rank], num_pages)
            for base in range(0, self._tp_size * per_rank, per_rank)
        ])  # fmt: skip


def _uncount_external_tokens(request: Any, num_tokens: int) -> None:
    """Take ``num_tokens`` off the external-token count vLLM recorded for ``request`` at
    admission (``Request.prefill_stats``, vLLM 0.32+; nothing to do where vLLM lacks it or
    already reported it): those tokens are recomputed, not loaded."""
    stats = getattr(request, "prefill_stats", None)
    if stats is None or not num_tokens or not hasattr(stats, "set"):
        return
    stats.set(
        num_prompt_tokens=stats.num_prompt_tokens,
        num_local_cached_tokens=stats.num_local_cached_tokens,
        num_external_cached_tokens=max(0, stats.num_external_cached_tokens - num_tokens),
    )  # fmt: skip

