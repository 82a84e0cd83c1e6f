"""KV events of the shared store for vLLM's own publisher: ``BlockStored`` / ``BlockRemoved``
with medium ``STORAGE`` for the pages the connector saved, found present (skipped saves,
verified loads) or found gone (a bad page deleted; a sweep: an operator's ``radixlink store
clear``, the store's own evictions).

Workers report what their store I/O did to which page (``reports.WorkerReports``; vLLM ships
them to the scheduler in ``KVConnectorOutput.kv_cache_events``); the scheduler side
(``StoreEvents``) turns a page every TP rank holds into vLLM's event, with vLLM's own block
hashes and tokens and the fields the running release has, for ``take_events`` (vLLM publishes
what it returns).

Owns the event building and the sweeps. Must not touch KV tensors or decide what is
saved. Nothing here raises into vLLM: a failure is logged and the events are dropped.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any
from urllib.parse import parse_qs, urlsplit

from vllm.distributed import kv_events as vllm_events
from vllm.distributed.kv_events import BlockRemoved, BlockStored

from radixlink.errors import StoreError
from radixlink.integrations.vllm.keys import GroupLayout, KeyScheme
from radixlink.integrations.vllm.metadata import PageJob
from radixlink.integrations.vllm.reports import RadixlinkKVEvents, StoreReport
from radixlink.pages import pageio
from radixlink.stores.base import Store

logger = logging.getLogger(__name__)

OWNERSHIP = "radixlink"  # vLLM's ``ownership``: the secondary tier that emitted the event
MEDIUM = getattr(vllm_events, "MEDIUM_STORAGE", "STORAGE")
MAX_PENDING = 16384  # pages planned and not yet reported by every rank (oldest dropped)
MAX_ANNOUNCED = 65536  # pages announced stored: not announced again; swept
SWEEP_S = 2.0  # how often the scheduler checks announced pages are still stored
SWEEP_PAGES = 256  # announced pages checked per sweep, longest-unchecked first
_REMOTE, _LOCAL = "REMOTE", "LOCAL"
_SCHEME_LOCALITY = {"redis": _REMOTE, "redis+cluster": _REMOTE, "mooncake": _REMOTE,
                    "file": _LOCAL, "memory": _LOCAL}  # fmt: skip


def kv_events_enabled(vllm_config: Any) -> bool:
    """Whether vLLM publishes KV cache events (``--kv-events-config``)."""
    config = getattr(vllm_config, "kv_events_config", None)
    return bool(config is not None and getattr(config, "enable_kv_cache_events", False))


def store_locality(url: str) -> str:
    """vLLM's ``locality`` of a store URL relative to the engine: ``REMOTE`` for network stores
    (Redis, Mooncake), ``LOCAL`` for a directory or memory; ``tiered://`` and ``faults://``
    answer for the store behind them."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in _SCHEME_LOCALITY:
        return _SCHEME_LOCALITY[scheme]
    query = parse_qs(parts.query)
    inner = (query.get("back") or query.get("inner") or [""])[0]
    return store_locality(inner) if inner else _LOCAL


@dataclass(slots=True)
class _Page:
    """What an event needs of one planned page, taken while its request is alive."""

    block_hash: bytes  # vLLM's hash of the page (the one its own GPU events carry)
    parent: bytes | None
    token_ids: list[int]
    lora_id: int | None
    lora_name: str | None
    extra_keys: Any
    salt: str
    ranks: int = 0  # bitmask of the ranks that reported it stored


class StoreEvents:
    """The scheduler side: pages planned (``note``), workers' reports folded in (``absorb``),
    vLLM's events handed out (``take``).

    A page becomes ``BlockStored`` once every TP rank reported it in the store, and only when
    not announced already; ``BlockRemoved`` as soon as one rank deleted it (a page is
    restorable only when every rank's part is present), or when a sweep finds it gone: every
    ``SWEEP_S`` ``take`` checks the ``SWEEP_PAGES`` announced pages checked longest ago, and all
    of them when that window is gone whole (an operator's ``radixlink store clear``). So a
    clear is published within a sweep, and the store's own evictions within a round of
    sweeps (``MAX_ANNOUNCED / SWEEP_PAGES * SWEEP_S``, about 9 minutes when full).

    Args:
        layouts: the groups taking part (same list as ``SchedulerSide``).
        scheme: key naming (sweeps build keys).
        store: the scheduler's store (presence only).
        tp_size: TP ranks.
        kv_cache_config: vLLM's, for the groups' spec kind and window.
        store_url: the store's URL (its ``locality``).
    """

    def __init__(self, *, layouts: Sequence[GroupLayout], scheme: KeyScheme, store: Store,
                 tp_size: int, kv_cache_config: Any, store_url: str):  # fmt: skip
        self._layouts = {g.group_id: g for g in layouts}
        self._scheme = scheme
        self._store = store
        self._all_ranks = (1 << tp_size) - 1
        self._tp_size = tp_size
        self._block_size = layouts[0].block_size if layouts else 0
        self._ratio = max(1, self._block_size // max(1, scheme.hash_block_size))
        self._fields = frozenset(getattr(BlockStored, "__struct_fields__", ()))
        self._removed_fields = frozenset(getattr(BlockRemoved, "__struct_fields__", ()))
        self._common = {"medium": MEDIUM, "locality": store_locality(store_url),
                        "ownership": OWNERSHIP}  # fmt: skip
        self._specs = {gid: _spec_fields(kv_cache_config, gid) for gid in self._layouts}
        self._pending: OrderedDict[tuple[int, str], _Page] = OrderedDict()
        self._announced: OrderedDict[tuple[int, str], _Page] = OrderedDict()
        self._out: list[Any] = []
        self._next_sweep = 0.0
        self.num_dropped = 0  # reports of pages no longer pending (past MAX_PENDING)

    def note(self, request: Any, job: PageJob, start: int, hashes: Sequence[str]) -> None:
        """A load or save of ``hashes`` (pages ``start..``) was planned for ``request``."""
        try:
            # NOTE: token-chain pages vLLM has not hashed yet get no event
            count = min(len(hashes), len(request.block_hashes) // self._ratio - start)
            by_hash = {hashes[i]: self._page(request, start + i, job.cache_salt)
                       for i in range(count)}  # fmt: skip
            pending = self._pending
            for g in job.groups:
                for h in g.hashes:
                    if h in by_hash:  # NOTE: a record per group: each counts its own ranks
                        pending[(g.group_id, h)] = replace(by_hash[h])
                        pending.move_to_end((g.group_id, h))
            while len(pending) > MAX_PENDING:
                pending.popitem(last=False)
        except Exception:  # noqa: BLE001 - never into vLLM's scheduler
            logger.exception("radixlink: KV events of a planned job dropped")

    def absorb(self, container: Any) -> None:
        """Fold in the workers' reports of one step (``KVConnectorOutput.kv_cache_events``)."""
        if not isinstance(container, RadixlinkKVEvents):
            return
        try:
            for report in container.get_all_events():
                if report.stored:
                    self._stored(report)
                else:
                    self._removed(report.group_id, report.hashes)
        except Exception:  # noqa: BLE001 - never into vLLM's scheduler
            logger.exception("radixlink: KV events of the workers' reports dropped")

    def take(self, now: float | None = None) -> list[Any]:
        """vLLM's events since the last call (after a sweep of the announced pages, when
        due)."""
        try:
            self._sweep(time.monotonic() if now is None else now)
        except Exception:  # noqa: BLE001 - never into vLLM's scheduler
            logger.exception("radixlink: the announced pages could not be checked")
        out, self._out = self._out, []
        return out

    def _page(self, request: Any, index: int, salt: str) -> _Page:
        ratio, size = self._ratio, self._block_size
        hashes = request.block_hashes
        lora = request.lora_request
        return _Page(
            block_hash=hashes[(index + 1) * ratio - 1],
            parent=hashes[index * ratio - 1] if index else None,
            token_ids=request.all_token_ids[index * size : (index + 1) * size],
            lora_id=lora.adapter_id if lora else None, lora_name=lora.name if lora else None,
            extra_keys=_extra_keys(request, index * size, (index + 1) * size), salt=salt,
        )  # fmt: skip

    def _stored(self, report: StoreReport) -> None:
        bit, done = 1 << report.rank, []
        for h in report.hashes:
            key = (report.group_id, h)
            page = self._pending.get(key)
            if page is None:
                if key in self._announced:
                    self._announced.move_to_end(key)
                else:
                    self.num_dropped += 1
                continue
            page.ranks |= bit
            if page.ranks != self._all_ranks:
                continue
            del self._pending[key]
            if key in self._announced:
                self._announced.move_to_end(key)
                continue
            self._announced[key] = page
            done.append(page)
        while len(self._announced) > MAX_ANNOUNCED:
            self._announced.popitem(last=False)
        self._out += self._stored_events(report.group_id, done)

    def _removed(self, group_id: int, hashes: Sequence[str]) -> None:
        gone = []
        for h in hashes:
            key = (group_id, h)
            page = self._announced.pop(key, None) or self._pending.get(key)
            if page is not None:
                page.ranks = 0
                gone.append(page.block_hash)
            elif self._scheme.scheme == "vllm":  # NOTE: the key's hash is vLLM's block hash
                gone.append(bytes.fromhex(h))
        if gone:
            self._out.append(self._event(BlockRemoved, self._removed_fields, {
                "block_hashes": [_external(b) for b in gone], "group_idx": group_id}))

    def _stored_events(self, group_id: int, pages: list[_Page]) -> list[Any]:
        """One ``BlockStored`` per run of chained pages (as vLLM's block pool emits them)."""
        events: list[Any] = []
        runs: list[list[_Page]] = []
        for page in pages:
            last = runs[-1][-1] if runs else None
            if last is not None and page.parent == last.block_hash and (
                    page.lora_name == last.lora_name):
                runs[-1].append(page)
            else:
                runs.append([page])
        for run in runs:
            first = run[0]
            extra = [p.extra_keys for p in run]
            events.append(self._event(BlockStored, self._fields, {
                "block_hashes": [_external(p.block_hash) for p in run],
                "parent_block_hash": None if first.parent is None else _external(first.parent),
                "token_ids": [t for p in run for t in p.token_ids],
                "block_size": self._block_size, "lora_id": first.lora_id,
                "lora_name": first.lora_name, "group_idx": group_id,
                "extra_keys": _event_extra_keys(extra) if any(e is not None for e in extra)
                else None, **self._specs[group_id],
            }))  # fmt: skip
        return events

    def _event(self, cls: Any, fields: frozenset[str], values: dict[str, Any]) -> Any:
        """``cls`` from the fields this vLLM release has (others are left out)."""
        values = {**values, **self._common}
        return cls(**{k: v for k, v in values.items() if k in fields})

    def _sweep(self, now: float) -> None:
        """Every ``SWEEP_S``: one presence batch over the ``SWEEP_PAGES`` announced pages
        checked longest ago; the gone ones are removed, the others checked again last. When
        every page of the window is gone (an operator's clear), every announced page is
        checked at once."""
        if now < self._next_sweep or not self._announced:
            return
        self._next_sweep = now + SWEEP_S
        window = list(islice(self._announced, SWEEP_PAGES))
        gone = self._absent(window)
        for key in window:
            if key not in gone:
                self._announced.move_to_end(key)
        if not gone:
            return
        if len(gone) == len(window):
            gone |= self._absent(list(self._announced))
        by_group: dict[int, list[str]] = {}
        for gid, h in self._announced:  # NOTE: in announce order (pages of a prompt in order)
            if (gid, h) in gone:
                by_group.setdefault(gid, []).append(h)
        for gid, hashes in by_group.items():
            self._removed(gid, hashes)

    def _absent(self, pages: list[tuple[int, str]]) -> set[tuple[int, str]]:
        """Which of the announced ``pages`` some TP rank's key is missing for (one batch)."""
        groups: dict[tuple[int, str], list[str]] = {}
        for gid, h in pages:
            groups.setdefault((gid, self._announced[gid, h].salt), []).append(h)
        keys: list[str] = []
        spans = []
        for (gid, salt), hashes in groups.items():
            for rank in range(self._tp_size):
                spans.append((gid, hashes, len(keys)))
                keys += self._scheme.keys(self._layouts[gid], hashes, rank, salt)
        try:
            present = pageio.present(self._store, keys)
        except StoreError as exc:
            logger.warning("radixlink: the announced pages could not be checked: %s", exc)
            return set()
        return {(gid, h) for gid, hashes, at in spans
                for h, ok in zip(hashes, present[at : at + len(hashes)]) if not ok}


def _external(block_hash: bytes) -> Any:
    """vLLM's published form of a block hash (bytes, or an int under
    ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``), as its own GPU events carry it."""
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    return maybe_convert_block_hash(block_hash)


def _extra_keys(request: Any, start: int, end: int) -> Any:
    """vLLM's extra hash keys of tokens ``[start, end)`` (LoRA, multimodal, salt), or None."""
    if not (request.lora_request or request.mm_features or request.cache_salt
            or getattr(request, "prompt_embeds", None) is not None):
        return None
    from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys

    return generate_block_hash_extra_keys(request, start, end, 0)[0]


def _event_extra_keys(extra: list[Any]) -> Any:
    from vllm.v1.core import kv_cache_utils

    convert = getattr(kv_cache_utils, "to_event_extra_keys", None)
    return convert(extra) if convert is not None else extra


def _spec_fields(kv_cache_config: Any, group_id: int) -> dict[str, Any]:
    """The group's ``kv_cache_spec_kind`` / ``kv_cache_spec_sliding_window`` (vLLM >= 0.32)."""
    try:
        from vllm.v1.kv_cache_interface import (
            get_kv_cache_spec_kind,
            get_kv_cache_spec_sliding_window,
        )
    except ImportError:
        return {}
    spec = kv_cache_config.kv_cache_groups[group_id].kv_cache_spec
    return {"kv_cache_spec_kind": get_kv_cache_spec_kind(spec).value,
            "kv_cache_spec_sliding_window": get_kv_cache_spec_sliding_window(spec)}
