"""The loads of one worker step as one batch: every distinct page key read once, as one LOAD job of
the page layer's ``TransferEngine`` (``get_into`` into its staging, every page verified in place
under ``pages.pageio``'s one corrupt-page policy), then the verdict split per request.

Owns the plan of a batch (which request's block takes which fetched row) and its split. Must
not write KV tensors (the worker does) or decide what vLLM does with a failure.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from radixlink.integrations.vllm.metadata import PageJob
from radixlink.pages import pageio
from radixlink.pages.engine import Completion, Job, TransferEngine

KeysFn = Callable[[PageJob, int, Sequence[str]], list[str]]
Rows = list[tuple[int, tuple[int, ...], list[int]]]  # per group (group_id, block_ids, rows)


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
    pages: Rows = field(default_factory=list)
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
    """A finished batch: per-request results, and the engine job whose staging they point into.

    Attributes:
        requests: one entry per load job, in job order.
        payloads: per group, its distinct pages as uint8 ``[pages, page_bytes]`` rows: views
            of the job's staging (row stride is the encoded frame, the payload after the
            header), so a page is never copied before it is scattered.
        bad_keys: keys whose stored value was present but bad (deleted from the store).
        job: the LOAD job (no lander): its staging stays held until ``release``.
        read_s: how long the job read and verified its pages (and landed them, when
            ``landed``).
        landed: the verified pages are in the blocks already (landed chunk by chunk on the
            I/O threads during the read: a CPU engine's); ``landed_s`` seconds went to it.
        done_at: ``time.perf_counter()`` when the job ended (the scatter waits from then on
            for the model runner's next ``get_finished``).
    """

    requests: list[RequestLoad]
    payloads: dict[int, torch.Tensor] = field(default_factory=dict)
    bad_keys: list[str] = field(default_factory=list)
    job: Job | None = None
    read_s: float = 0.0
    landed: bool = False
    landed_s: float = 0.0
    done_at: float = 0.0

    def release(self, engine: TransferEngine) -> None:
        """Give the staging back (after every scatter); the payloads are invalid afterwards."""
        self.payloads.clear()
        if self.job is not None:
            engine.release(self.job)
            self.job = None


@dataclass(slots=True)
class LoadPlan:
    """A step's loads before the read: per job its groups' ``(group_id, block_ids, rows)``,
    and per group the distinct keys to read (a key shared by several jobs once).

    ::

        staging of group g  | lead | header | payload 0 | tag? | pad | lead | header | ...
        payloads[g]          rows = the payloads, at the frames' stride (``pages.staging``)
    """

    jobs: list[PageJob]
    rows: list[Rows]
    keys: dict[int, dict[str, int]]  # group id -> key -> row, for groups with pages

    @classmethod
    def of(cls, jobs: Sequence[PageJob], groups: Sequence[int], keys: KeysFn) -> LoadPlan:
        index: dict[int, dict[str, int]] = {gid: {} for gid in groups}
        rows: list[Rows] = []
        for job in jobs:
            per_group = []
            for g in job.groups:
                seen = index[g.group_id]
                wanted = [seen.setdefault(k, len(seen)) for k in keys(job, g.group_id, g.hashes)]
                per_group.append((g.group_id, g.block_ids, wanted))
            rows.append(per_group)
        return cls(list(jobs), rows, {gid: seen for gid, seen in index.items() if seen})

    def blocks_by_row(self) -> dict[int, list[list[int]]]:
        """Per group with pages, per fetched row the blocks it lands in (one row may land in
        several requests' blocks)."""
        out = {gid: [[] for _ in seen] for gid, seen in self.keys.items()}
        for per_group in self.rows:
            for gid, block_ids, wanted in per_group:
                for block_id, row in zip(block_ids, wanted, strict=True):
                    out[gid][row].append(block_id)
        return out

    def pools(self, codecs: Mapping[int, pageio.Codec]) -> list[tuple[pageio.Codec, list[str]]]:
        """``(codec, keys)`` per group with pages, in the order of the job's parts."""
        return [(codecs[gid], list(seen)) for gid, seen in self.keys.items()]

    def failed(self, error: str) -> FetchedBatch:
        """Every request failed whole (the read raised, or never ran)."""
        return FetchedBatch(requests=[
            RequestLoad(req_id=job.req_id, num_pages=job.num_pages, error=error,
                        bad_blocks={b for g in job.groups for b in g.block_ids})
            for job in self.jobs
        ])  # fmt: skip

    def split(self, job: Job | None, done: Completion | None) -> FetchedBatch:
        """The completed read of ``job`` per request: each keeps its verified leading pages of
        each group, the rest are its bad blocks (a bad page fails only the requests that need
        it). No job (no group has pages): every request loads nothing, and nothing failed."""
        if job is None or done is None:
            return FetchedBatch(requests=[RequestLoad(req_id=j.req_id, num_pages=j.num_pages)
                                          for j in self.jobs])  # fmt: skip
        read = done.read
        if read is None:  # NOTE: the store raised, or the engine closed before the read ran
            batch = self.failed(done.detail or done.status.value)
            batch.job = job
            return batch
        batch = FetchedBatch(requests=[], bad_keys=read.bad_keys, job=job,
                             read_s=done.seconds, done_at=time.perf_counter(),
                             payloads={gid: part.frames.payloads()
                                       for gid, part in zip(self.keys, job.parts)})
        offsets, pos = {}, 0
        for gid, seen in self.keys.items():
            offsets[gid] = pos
            pos += len(seen)
        reasons = read.reasons
        for page_job, per_group in zip(self.jobs, self.rows, strict=True):
            load = RequestLoad(req_id=page_job.req_id, num_pages=page_job.num_pages)
            for gid, block_ids, wanted in per_group:
                if read.ok:  # NOTE: the common case: no per-page look at the reasons
                    if wanted:
                        load.pages.append((gid, block_ids, wanted))
                    continue
                why_not = [reasons[offsets[gid] + row] for row in wanted]
                good = next((i for i, why in enumerate(why_not) if why is not None), len(wanted))
                load.reasons.update(why for why in why_not if why is not None)
                load.bad_blocks.update(block_ids[good:])
                if good:
                    load.pages.append((gid, block_ids[:good], wanted[:good]))
            batch.requests.append(load)
        return batch
