"""The loads of one worker step as one batch: every distinct page key fetched once through
``pages.pageio`` (``get_into`` into reused host staging, every page verified in place, every
bad one named, counted and, when present, deleted from the store).

Owns a batch's staging buffers until its pages are scattered (``FetchedBatch.release``). Must
not write KV tensors (the worker scatters on the model runner's thread) or decide what vLLM
does with a failure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from radixlink.integrations.vllm.metadata import PageJob
from radixlink.pages import pageio
from radixlink.pages.staging import StagingArena
from radixlink.stores.base import Store

KeysFn = Callable[[PageJob, int, Sequence[str]], list[str]]


@dataclass(slots=True)
class RequestLoad:
    """One request's part of a fetched batch.

    Attributes:
        req_id: the vLLM request id.
        pages: per group ``(group_id, block_ids, rows)``: the verified leading pages;
            ``block_ids[i]`` takes row ``rows[i]`` of the batch's payloads of that group.
        bad_blocks: block ids not loaded (from the first bad page of a group on).
        reasons: why pages of this request are bad, counted per reason (``missing``, or
            the codec's ``checksum``, ``key``, ``truncated``, ``fingerprint``, ``auth`` ...).
        num_pages: pages the request asked for.
        error: the store error that failed the whole batch ("" when none).
    """

    req_id: str
    pages: list[tuple[int, tuple[int, ...], list[int]]] = field(default_factory=list)
    bad_blocks: set[int] = field(default_factory=set)
    reasons: Counter[str] = field(default_factory=Counter)
    num_pages: int = 0
    error: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.error or self.bad_blocks)

    def describe(self) -> str:
        """The failure in words, for one log line."""
        if self.error:
            return f"store error: {self.error}"
        reasons = ", ".join(f"{name}={n}" for name, n in sorted(self.reasons.items()))
        return f"{sum(self.reasons.values())} of {self.num_pages} pages bad ({reasons})"


@dataclass(slots=True)
class FetchedBatch:
    """A finished batch: per-request results, and the staging they point into.

    Attributes:
        requests: one entry per load job, in job order.
        payloads: per group, its distinct pages as uint8 ``[pages, page_bytes]`` rows: views
            of the staging buffer (row stride is the encoded frame, the payload after the
            header), so a page is never copied before it is scattered.
        num_fetched: distinct pages read from the store (each once, however many requests
            share it).
        bad_keys: keys whose stored value was present but bad (deleted from the store).
    """

    requests: list[RequestLoad]
    payloads: dict[int, torch.Tensor] = field(default_factory=dict)
    num_fetched: int = 0
    bad_keys: list[str] = field(default_factory=list)
    staging: list[tuple[torch.Tensor, memoryview]] = field(default_factory=list)

    def release(self, arena: StagingArena) -> None:
        """Give the staging back (after every scatter); the payloads are invalid afterwards."""
        self.payloads.clear()
        for buffer in self.staging:
            arena.release(*buffer)
        self.staging.clear()


def fetch_batch(jobs: Sequence[PageJob], *, store: Store, codecs: Mapping[int, pageio.Codec],
                arena: StagingArena, keys: KeysFn, bad: pageio.BadKeys | None = None
                ) -> FetchedBatch:  # fmt: skip
    """Read the pages of ``jobs`` with one ``get_into`` of their distinct keys, verify each
    distinct page once (``pageio.read``: present bad pages are deleted and added to ``bad``),
    and split the result per request.

    ::

        staging of group g  | lead | header | payload 0 | tag? | pad | lead | header | ...
        payloads[g]          rows = the payloads, at the frames' stride (``pages.staging``)

    Raises:
        StoreError and whatever the store raises: the caller fails every job of the batch
        (the staging is released first).
    """
    rows: dict[int, dict[str, int]] = {gid: {} for gid in codecs}
    job_rows: list[list[tuple[int, tuple[int, ...], list[int]]]] = []
    for job in jobs:
        per_group = []
        for g in job.groups:
            index = rows[g.group_id]
            wanted = [index.setdefault(k, len(index)) for k in keys(job, g.group_id, g.hashes)]
            per_group.append((g.group_id, g.block_ids, wanted))
        job_rows.append(per_group)
    batch = FetchedBatch(requests=[])
    groups = [gid for gid, index in rows.items() if index]
    if not groups:
        batch.requests = [RequestLoad(req_id=job.req_id, num_pages=job.num_pages)
                          for job in jobs]
        return batch
    staging, parts = pageio.stage_pages(arena, [(codecs[gid], list(rows[gid])) for gid in groups])
    batch.staging.append(staging)
    try:
        read = pageio.read(store, parts, bad=bad)
    except BaseException:
        batch.release(arena)
        raise
    batch.payloads = {gid: part.frames.payloads() for gid, part in zip(groups, parts)}
    batch.num_fetched = len(read.reasons)
    batch.bad_keys = read.bad_keys
    offsets, pos = {}, 0
    for gid in groups:
        offsets[gid] = pos
        pos += len(rows[gid])
    reasons = read.reasons
    for job, per_group in zip(jobs, job_rows, strict=True):
        load = RequestLoad(req_id=job.req_id, num_pages=job.num_pages)
        for gid, block_ids, wanted in per_group:
            why_not = [reasons[offsets[gid] + row] for row in wanted]
            good = next((i for i, why in enumerate(why_not) if why is not None), len(wanted))
            load.reasons.update(why for why in why_not if why is not None)
            load.bad_blocks.update(block_ids[good:])
            if good:
                load.pages.append((gid, block_ids[:good], wanted[:good]))
        batch.requests.append(load)
    return batch
