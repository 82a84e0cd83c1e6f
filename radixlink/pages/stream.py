"""How a big load is read: in chunks (``CHUNK_BYTES``), each checked while the next is read,
and, for a ``Stream``, each chunk into staging of its own, landed as soon as it is checked and
given back at once (``read_streamed``), so a load holds at most ``STREAM_WINDOW`` + 1 chunks of
staging whatever its size. A stream whose pages can be written where they land (``targets``)
is read straight into them from a store that ``scatters``: one copy instead of two, each page
checked on the reading thread as soon as it is read, while its bytes are in the core's cache.

Given a second core, chunks are checked on the engine's verify threads while the next is read;
on a thread bound to one core (``one_core``: vLLM's CPU worker binds its threads to the cores
of its OMP threads) they are checked in turn, each while its staging is still in cache.

Owns the chunk size, the window and the streamed read's order. The threads, the store and the
staging are the engine's (``pages.engine``, which runs every job); must not import it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from radixlink.pages import pageio
from radixlink.pages.staging import StagingArena, frame_stride, frames_bytes
from radixlink.stores.base import Store

CHUNK_BYTES = 16 << 20
"""A load over this many bytes of frames is read in chunks of it, each verified while the next
is read. Measured on 2 cores (32 pages of 5.9 MB from a warm ``file://`` store, medians of 5):
unsealed 5.08 GB/s in one read, 6.45 with 16 MiB chunks (32 MiB: 6.38, 64 MiB: 6.19); sealed
(keyed BLAKE3, which releases the GIL) 1.83 -> 3.43 GB/s."""

DIRECT_READ_BYTES = 256 << 20
"""A stream whose pages are all read straight into their targets, up to this many payload
bytes, is read in one pass, not in chunks: chunks bound staging, and a direct read holds
none, only the views of its pages (a SGLang page is 60; 256 MiB of SmolLM2 pages, 22k). Each
chunk boundary cost the read of the pages around it (a plain process, 47 MB in 3 chunks:
12.56 -> 11.89 ms in one pass; inside SGLang 1-2 ms a boundary)."""

STREAM_WINDOW = 2
"""A streamed load reads a chunk only once no more than this many earlier ones are still being
verified or landed: its staging stays within ``STREAM_WINDOW + 1`` chunks."""

Check = Callable[[], pageio.ReadResult]


@dataclass(frozen=True, slots=True)
class Stream:
    """A LOAD read chunk by chunk into staging of its own and landed as it goes.

    Attributes:
        pools: per pool its codec and the store keys of its pages.
        land: called on the thread that verified a chunk, with its spans (``pageio.Span``:
            pool, first page, count), its pages (frames valid only during the call) and their
            verdict; lands the whole verified ones. Its raise fails the job.
        targets: per page of a span, the writable views its payload lands in (its rows in
            the pools), or None. Given, and with a store that ``scatters``, each chunk is read
            straight into them and verified where it lies: one copy, no staging and no
            ``land`` (a page that fails its check has written its slots, which only this load
            holds, and fails the load). None where a span's pages cannot be written so.
    """

    pools: Sequence[tuple[pageio.PageCodec, Sequence[str]]]
    land: Callable[[Sequence[pageio.Span], Sequence[pageio.PageFrames], pageio.ReadResult],
                   None]
    targets: Callable[[pageio.Span], Sequence[Sequence[memoryview]] | None] | None = None

    @property
    def num_pages(self) -> int:
        return sum(len(keys) for _, keys in self.pools)

    @property
    def num_payload_bytes(self) -> int:
        return sum(len(keys) * codec.page_bytes for codec, keys in self.pools)

    def spans(self) -> list[list[pageio.Span]]:
        return pageio.spans([(len(keys), frame_stride(codec.frame_bytes))
                             for codec, keys in self.pools], CHUNK_BYTES)


def chunk_bytes(codecs: Sequence[pageio.PageCodec]) -> int:
    """The staging of a full chunk of the largest of these pools: what every chunk of a
    streamed load over them asks for (0: no pools)."""
    return max((frames_bytes([(max(1, CHUNK_BYTES // frame_stride(c.frame_bytes)),
                               c.page_bytes, c.frame_bytes)]) for c in codecs), default=0)


def read_streamed(stream: Stream, store: Store, arena: StagingArena, bad: pageio.BadKeys,
                  verifier: Callable[[], ThreadPoolExecutor]) -> pageio.ReadResult:
    """Read ``stream`` chunk by chunk, each into staging of its own, verified and landed on a
    ``verifier`` thread while the next one is read (one chunk, or one core: each in turn
    here); or, straight into its ``targets``, each page verified here as soon as it is read
    (``pageio.read_scattered``), in one pass up to ``DIRECT_READ_BYTES``. A chunk is read
    once no more than ``STREAM_WINDOW`` earlier ones are still out.

    Raises:
        Exception: the store's or the landing's, once every chunk's staging is back.
    """
    reads = stream.spans()
    if len(reads) > 1 and store.scatters and stream.num_payload_bytes <= DIRECT_READ_BYTES:
        whole = scatter_targets(stream, [(pool, 0, len(keys))
                                         for pool, (_, keys) in enumerate(stream.pools)])
        if whole is not None:
            return pageio.read_scattered(store, whole, bad=bad)
    size = chunk_bytes([codec for codec, _ in stream.pools])
    parallel = len(reads) > 1 and not one_core()

    def land(spans: Sequence[pageio.Span], piece: Sequence[pageio.PageFrames],
             fetched: pageio.Fetched, staging: tuple[Any, memoryview]) -> pageio.ReadResult:
        try:
            read = pageio.check(store, piece, fetched, bad=bad)
            stream.land(spans, piece, read)
            return read
        finally:
            arena.release(*staging)

    checks: list[Check] = []
    try:
        for k, spans in enumerate(reads):
            if k >= STREAM_WINDOW:
                checks[k - STREAM_WINDOW]()  # NOTE: bounds the staging out at once
            direct = scatter_targets(stream, spans) if store.scatters else None
            if direct is not None:
                # NOTE: checked here, page by page, not on a verify thread: the xxhash binding
                # lets the GIL go and takes it back around each update (60 a page, one per
                # pool row), so beside it every syscall return of the next read waited on the
                # GIL (SGLang on CPU: 3.35 GB/s median a load that way, 3.95 in turn: measured)
                read = pageio.read_scattered(store, direct, bad=bad)
                checks.append(_ready(read))
                continue
            staging, piece = pageio.stage_pages(arena, [
                (stream.pools[pool][0], stream.pools[pool][1][first : first + count])
                for pool, first, count in spans], size)  # fmt: skip
            try:
                fetched = pageio.fetch(store, piece)
            except BaseException:
                arena.release(*staging)
                raise
            check = functools.partial(land, spans, piece, fetched, staging)
            if parallel:
                checks.append(verifier().submit(check).result)
            else:
                read = check()
                checks.append(_ready(read))
    finally:  # NOTE: every chunk's staging is back once each check ended
        results = settled(checks)
    return pageio.ReadResult.joined(results)


def scatter_targets(stream: Stream,
                    spans: Sequence[pageio.Span]) -> list[pageio.ScatteredPages] | None:
    """The chunk's pages as reads straight into their destinations, or None (the stream has
    no ``targets``, or some span's pages cannot be written so: the chunk goes through
    staging)."""
    if stream.targets is None:
        return None
    out = []
    for span in spans:
        payloads = stream.targets(span)
        if payloads is None:
            return None
        codec, keys = stream.pools[span[0]]
        out.append(pageio.ScatteredPages(codec, keys[span[1] : span[1] + span[2]], payloads))
    return out


def one_core() -> bool:
    """Whether the calling thread may run on one core only. Then a verify thread overlaps
    nothing and costs a GIL handoff per chunk (vLLM's CPU worker binds its threads to the
    cores of its OMP threads: one here, beside its busy engine loop; in turn on the I/O thread,
    a 188.7 MB load took 24-27 ms against 28-34 ms, measured), so chunks are checked in turn,
    each while its staging is in cache."""
    return len(os.sched_getaffinity(0)) == 1


def _ready(read: pageio.ReadResult) -> Check:
    """A check that has run: its result."""
    return lambda: read


def settled(checks: Sequence[Check]) -> list[pageio.ReadResult]:
    """Every check's result, waiting for all of them even when one raised (then the first
    error is raised, once none runs)."""
    out, error = [], None
    for check in checks:
        try:
            out.append(check())
        except Exception as exc:  # noqa: BLE001 - raised below, once every check ended
            error = error or exc
    if error is not None:
        raise error
    return out
