"""The loads of one worker step as one batch: every distinct page key fetched once, with
``get_into``, into reused host staging; every page verified in place, every bad one named.

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
from radixlink.memory.host import StagingArena
from radixlink.stores.base import Store
from radixlink.stores.codec import HEADER_BYTES, PageCodec

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


def fetch_batch(jobs: Sequence[PageJob], *, store: Store, codecs: Mapping[int, PageCodec],
                arena: StagingArena, keys: KeysFn) -> FetchedBatch:  # fmt: skip
    """Read the pages of ``jobs`` with one ``get_into`` of their distinct keys, verify each
    distinct page once, and split the result per request.

    ::

        staging of group g  | frame 0: header | payload 0 | tag? | frame 1: ... |
                            0                  HEADER_BYTES       frame_bytes
        payloads[g]          rows = payload i at  i * frame_bytes + HEADER_BYTES

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
    all_keys: list[str] = []
    frames: list[memoryview] = []
    for gid, index in rows.items():
        if not index:
            continue
        frame_bytes = codecs[gid].frame_bytes
        buffer, view = arena.acquire(len(index) * frame_bytes)
        batch.staging.append((buffer, view))
        batch.payloads[gid] = buffer.as_strided(
            (len(index), codecs[gid].page_bytes), (frame_bytes, 1), HEADER_BYTES)
        all_keys += index
        frames += [view[i * frame_bytes : (i + 1) * frame_bytes] for i in range(len(index))]
    try:
        sizes = store.get_into(all_keys, frames) if all_keys else []
    except BaseException:
        batch.release(arena)
        raise
    batch.num_fetched = len(all_keys)
    bad = _verify(rows, codecs, all_keys, frames, sizes)
    batch.bad_keys = [all_keys[pos] for pos, why in bad.items() if why != "missing"]
    offsets, pos = {}, 0
    for gid, index in rows.items():
        offsets[gid] = pos
        pos += len(index)
    for job, per_group in zip(jobs, job_rows, strict=True):
        load = RequestLoad(req_id=job.req_id, num_pages=job.num_pages)
        for gid, block_ids, wanted in per_group:
            reasons = [bad.get(offsets[gid] + row) for row in wanted]
            good = next((i for i, why in enumerate(reasons) if why is not None), len(wanted))
            load.reasons.update(why for why in reasons if why is not None)
            load.bad_blocks.update(block_ids[good:])
            if good:
                load.pages.append((gid, block_ids[:good], wanted[:good]))
        batch.requests.append(load)
    return batch


def _verify(rows: Mapping[int, Mapping[str, int]], codecs: Mapping[int, PageCodec],
            keys: Sequence[str], frames: Sequence[memoryview],
            sizes: Sequence[int | None]) -> dict[int, str]:  # fmt: skip
    """Positions (in ``keys``) of the pages that are not whole verified pages, with why."""
    bad: dict[int, str] = {}
    pos = 0
    for gid, index in rows.items():
        codec = codecs[gid]
        for _ in index:
            view, why = _verify_read(codec, frames[pos], sizes[pos], keys[pos])
            if why is None and view is not None and view.nbytes != codec.page_bytes:
                why = "short"  # a verified page of fewer bytes than this layout's page
            if why is not None:
                bad[pos] = why
            pos += 1
    return bad


def _verify_read(codec: PageCodec, frame: memoryview, size: int | None,
                 key: str) -> tuple[memoryview | None, str | None]:  # fmt: skip
    """``codec.verify`` of one ``get_into`` result; a value longer than its frame (of which
    only the head was copied) is a ``length`` miss."""
    if size is None or size <= frame.nbytes:
        return codec.verify(None if size is None else frame[:size], key)
    view, why = codec.verify(frame, key)
    if view is None:
        return None, why
    codec.count_miss("length")  # NOTE: a whole page followed by extra bytes
    return None, "length"
