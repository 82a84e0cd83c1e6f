"""Page I/O, written once for the transfer engine and every adapter (the tree's linker, SGLang's
linker and HiCache backend, vLLM's workers): one codec per pool, batched get -> verify into
staging frames (``Store.get_into``), encode in place -> put from staging frames, the presence
query, and the one corrupt-page policy.

The policy: every page of a read that is not a whole verified page of its pool's layout is a
counted miss with its reason (``missing``, ``short``, or a codec reason: ``checksum``, ``key``
(foreign key), ``truncated``, ``fingerprint`` (wrong layout), ``auth`` (unsealed, forged) ...),
every *present* bad page of the batch is deleted from the store at once, and its key is
remembered in ``BadKeys`` so a writer that skips present pages still overwrites it with the
recomputed page.

Owns those rules. Must not touch the tree, pools or threads: callers gather into and scatter
from the frames (``pages.staging``), and decide what a miss means for their engine.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from radixlink.pages.badkeys import BadKeys
from radixlink.pages.staging import Frames, StagingArena, frames_bytes, layout_frames
from radixlink.stores.base import Store
from radixlink.stores.codec import PageCodec
from radixlink.stores.pageformat import HEADER_BYTES, SHORT  # SHORT: callers' miss reason

logger = logging.getLogger(__name__)

Codec = PageCodec  # NOTE: the one name callers outside stores/ use for a pool's codec
MISSING = "missing"  # the reason of a miss the codec does not see


def make_codec(fingerprint: str, page_bytes: int, *, secret: Any = None,
               checksum: str = "auto", mac: str | None = None) -> PageCodec:
    """The codec of one pool: pages of ``page_bytes`` under layout ``fingerprint``, sealed
    with ``secret`` (a store's ``page_secret``, which brings its MAC; or bytes and ``mac``)
    when there is one.

    Raises:
        ValueError: a bad ``page_bytes``, checksum name, secret or MAC name.
    """
    return PageCodec(fingerprint, page_bytes, checksum, secret=secret, mac=mac)


def leading_present(flags: Sequence[bool]) -> int:
    """How many leading pages of a key chain are present (``flags`` from ``present``)."""
    return next((i for i, ok in enumerate(flags) if not ok), len(flags))


def present(store: Store, keys: Sequence[str], bad: BadKeys | None = None) -> list[bool]:
    """One ``exists`` batch over ``keys``; keys found bad here (``bad``) read absent."""
    flags = store.exists(keys) if keys else []
    return bad.mask(keys, flags) if bad is not None else list(flags)


# ---------------------------------------------------------------- reads

@dataclass(frozen=True, slots=True)
class PageFrames:
    """One pool's pages of a read or write: codec, keys and their frames in staging."""

    codec: PageCodec
    keys: Sequence[str]
    frames: Frames


@dataclass(slots=True)
class ReadResult:
    """What a read found.

    Attributes:
        reasons: per page (all parts, in order) None for a whole verified page, else why not.
        ok: every page is a whole verified page.
        bad_keys: the present bad pages' keys (deleted from the store).
        num_bytes: payload bytes verified.
    """

    reasons: list[str | None]
    ok: bool = True
    bad_keys: list[str] = field(default_factory=list)
    num_bytes: int = 0

    def misses(self) -> Counter[str]:
        """Bad pages per reason."""
        return Counter(why for why in self.reasons if why is not None)

    def num_missing(self) -> int:
        return sum(why == MISSING for why in self.reasons)

    @classmethod
    def joined(cls, reads: Sequence[ReadResult]) -> ReadResult:
        """One result of consecutive reads (``chunks``'s, in order)."""
        if len(reads) == 1:
            return reads[0]
        out = cls(reasons=[])
        for read in reads:
            out.reasons += read.reasons
            out.ok = out.ok and read.ok
            out.bad_keys += read.bad_keys
            out.num_bytes += read.num_bytes
        return out


def stage_pages(arena: StagingArena, pools: Sequence[tuple[PageCodec, Sequence[str]]],
                min_bytes: int = 0) -> tuple[tuple[Any, memoryview], list[PageFrames]]:
    """Staging from ``arena`` for ``(codec, keys)`` per pool: one buffer (of at least
    ``min_bytes``: every chunk of a streamed load asks for one size, so a short last chunk
    reuses the buffers the others did), one ``PageFrames`` per pool. Give it back with
    ``arena.release(*staging)`` once its pages are written, or landed."""
    sizes = []
    for codec, keys in pools:
        sizes.append((len(keys), codec.page_bytes, codec.frame_bytes))
    staging = arena.acquire(max(min_bytes, frames_bytes(sizes)))
    parts = []
    for (codec, keys), frames in zip(pools, layout_frames(staging[0], staging[1], sizes)):
        parts.append(PageFrames(codec, keys, frames))
    return staging, parts


Span = tuple[int, int, int]
"""``(pool, first page, count)``: a run of one pool's pages."""


def spans(pools: Sequence[tuple[int, int]], max_bytes: int) -> list[list[Span]]:
    """Pools of ``(pages, frame stride)`` cut into consecutive reads of at most ``max_bytes``
    of frames each (at least one page): per read its spans, the pages in order, each read one
    pool's. One read of every pool when everything fits."""
    if sum(count * stride for count, stride in pools) <= max_bytes:
        return [[(pool, 0, count) for pool, (count, _) in enumerate(pools)]]
    out = []
    for pool, (count, stride) in enumerate(pools):
        step = max(1, max_bytes // stride)
        out += [[(pool, start, min(step, count - start))] for start in range(0, count, step)]
    return out


def chunks(parts: Sequence[PageFrames], max_bytes: int) -> list[list[PageFrames]]:
    """``parts`` cut as ``spans`` cuts them, the frames the same memory."""
    reads = spans([(part.frames.count, part.frames.stride) for part in parts], max_bytes)
    if len(reads) == 1:
        return [list(parts)]
    out = []
    for (pool, start, count), in reads:
        part = parts[pool]
        frames = dataclasses.replace(part.frames, count=count,
                                     offset=part.frames.offset + start * part.frames.stride)
        out.append([PageFrames(part.codec, part.keys[start : start + count], frames)])
    return out


def fetch(store: Store, parts: Sequence[PageFrames]) -> Fetched:
    """One ``get_into`` of every part's keys into its frames (no copy besides the store's)."""
    keys: list[str] = []
    frames: list[memoryview] = []
    for part in parts:
        keys += part.keys
        frames += part.frames.frames()
    return Fetched(store.get_into(keys, frames) if keys else [], frames)


@dataclass(frozen=True, slots=True)
class Fetched:
    """What ``fetch`` read: per page its stored length (None: missing) and its frame."""

    sizes: list[int | None]  # NOTE: None in sizes: a watched load must not land early
    frames: list[memoryview]


def check(store: Store, parts: Sequence[PageFrames], fetched: Fetched, *,
          bad: BadKeys | None = None) -> ReadResult:
    """Verify every page ``fetch`` read, under the one policy: each bad page a counted miss
    with its reason, every present bad one deleted from the store (and added to ``bad``).
    A failed delete is logged, never raised: ``bad`` still masks the key and the next write
    overwrites it."""
    sizes, frames = fetched.sizes, fetched.frames
    reasons: list[str | None] = []
    pos = 0
    for part in parts:
        codec = part.codec
        for key in part.keys:
            reasons.append(_verify(codec, frames[pos], sizes[pos], key))
            pos += 1
    return _verdict(store, parts, reasons, bad)


@dataclass(frozen=True, slots=True)
class ScatteredPages:
    """One pool's pages of a read straight into their destination (``read_scattered``):
    codec, keys and per page the writable views its payload goes to, in order."""

    codec: PageCodec
    keys: Sequence[str]
    payloads: Sequence[Sequence[memoryview]]


def read_scattered(store: Store, parts: Sequence[ScatteredPages], *,
                   bad: BadKeys | None = None) -> ReadResult:
    """One ``get_scattered`` of every part's keys: each page's header and tag into a small
    staging of this read's, its payload straight into its views (the one copy of a load),
    and each page verified where it lies (``PageCodec.verify_scattered``) as soon as it is
    read, under ``check``'s policy. From a store that ``reads_in_parts`` the checksum is fed
    each run of a page as it is read, while the run is in cache (``pagefiles.PART_BYTES``).
    Unsealed xxh3 pages from a store with ``get_scattered_xxh3`` (a directory with its
    compiled loop) are read and checksummed in one call that lets the GIL go, and their
    headers checked after it.

    Raises:
        ValueError: a part's payloads and keys differ in number, or the store did not hand
            every page over (``each``).

    Verified page by page, a page's bytes are still in the core's cache: over 22 SmolLM2
    pages (16 MiB in 60 pool tensors) the check took 0.37 ms read by read, 1.05-1.16 ms
    after the whole chunk was read (measured in a plain process).
    """
    keys: list[str] = []
    targets: list[list[memoryview]] = []
    checks: list[tuple[PageCodec, memoryview, Sequence[memoryview], memoryview]] = []
    for part in parts:
        codec, count = part.codec, len(part.keys)
        if len(part.payloads) != count:
            raise ValueError(f"read_scattered: {count} keys but {len(part.payloads)} payloads; "
                             "pass one list of views per page")
        tag = codec.frame_bytes - HEADER_BYTES - codec.page_bytes
        size = HEADER_BYTES + tag
        small = memoryview(bytearray(count * size))
        for i, payload in enumerate(part.payloads):
            head = small[i * size : i * size + HEADER_BYTES]
            tail = small[i * size + HEADER_BYTES : (i + 1) * size]
            checks.append((codec, head, payload, tail))
            targets.append([head, *payload, tail])
        keys += part.keys
    reasons: list[str | None] = []
    page, running, fed = -1, None, 0  # NOTE: the page being read in runs: its checksum so far

    def each(i: int, size: int | None) -> None:
        nonlocal page
        codec, head, payload, tail = checks[i]
        whole = running if page == i and fed == len(payload) else None
        page = -1
        reasons.append(codec.verify_scattered(head, payload, tail, size, keys[i], whole))

    def run_read(i: int, n: int) -> None:
        nonlocal page, running, fed
        payload = checks[i][2]
        if page != i:
            page, running, fed = i, checks[i][0].checksum_stream(), 0
        if running is None:
            return
        upto = min(n - 1, len(payload))  # NOTE: target 0 is the header
        for piece in payload[fed:upto]:
            running.update(piece)
        fed = max(fed, upto)

    hashed = (store.get_scattered_xxh3(keys, targets)
              if keys and all(p.codec.checks_xxh3 for p in parts) else None)
    if hashed is not None:  # NOTE: each page's checksum came with its read: its header left
        for i, (size, digest) in enumerate(zip(*hashed, strict=True)):
            codec, head, payload, tail = checks[i]
            reasons.append(codec.verify_scattered(head, payload, tail, size, keys[i],
                                                  None if digest is None else _Digest(digest)))
    elif keys:
        # NOTE: only for a checksum fed as read: a sealed page read in runs is tagged once
        # after its read all the same, and its runs' extra readv calls cost (SGLang: a sealed
        # load 1.65 -> 1.48 GB/s, ABAB medians)
        if store.reads_in_parts and any(p.codec.checksum_stream() for p in parts):
            store.get_scattered(keys, targets, each, part=run_read)
        else:
            store.get_scattered(keys, targets, each)
    if len(reasons) != len(keys):
        raise ValueError(f"{type(store).__name__}.get_scattered called each for "
                         f"{len(reasons)} of {len(keys)} keys; a store's get_scattered must "
                         "call it once per key, in order (Store.get_scattered)")
    return _verdict(store, parts, reasons, bad)


class _Digest:
    """A checksum computed as a page was read, as ``PageCodec.verify_scattered`` takes one."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value

    def intdigest(self) -> int:
        return self.value


def _verdict(store: Store, parts: Sequence[PageFrames] | Sequence[ScatteredPages],
             reasons: list[str | None], bad: BadKeys | None) -> ReadResult:
    """The policy over the reasons of the parts' pages, in order: the present bad pages
    deleted (and added to ``bad``), the verified payload bytes counted."""
    bad_keys: list[str] = []
    num_bytes = num_bad = pos = 0
    for part in parts:
        page_bytes = part.codec.page_bytes
        for key in part.keys:
            why = reasons[pos]
            pos += 1
            if why is None:
                num_bytes += page_bytes
                continue
            num_bad += 1
            if why != MISSING:
                bad_keys.append(key)
    if bad_keys:
        drop_bad(store, bad_keys, bad)
    return ReadResult(reasons=reasons, ok=not num_bad, bad_keys=bad_keys, num_bytes=num_bytes)


def read(store: Store, parts: Sequence[PageFrames], *, bad: BadKeys | None = None) -> ReadResult:
    """``fetch`` then ``check``: batched get -> verify into the parts' frames, whose payloads
    (``frames.payloads()``) then hold the verified pages for the caller to land."""
    return check(store, parts, fetch(store, parts), bad=bad)


def drop_bad(store: Store, keys: Sequence[str], bad: BadKeys | None = None) -> None:
    """Delete present bad pages (the policy's second half) and remember them in ``bad``."""
    if bad is not None:
        bad.add(keys)
    try:
        store.delete(list(keys))
    except Exception as exc:  # noqa: BLE001 - the next write still overwrites them
        logger.warning("radixlink could not delete %d bad pages: %s", len(keys), exc)


def _verify(codec: PageCodec, frame: memoryview, size: int | None, key: str) -> str | None:
    """Why the page read into ``frame`` (``size`` bytes stored) is not a whole verified page
    of ``codec``'s layout, or None. A value longer than its frame (only its head was copied)
    is a ``length`` miss."""
    if size is None:
        return MISSING
    if size > frame.nbytes:
        view, why = codec.verify(frame, key)
        if view is None:
            return why
        codec.count_miss("length")  # NOTE: a whole page followed by extra bytes
        return "length"
    view, why = codec.verify(frame[:size], key)
    if view is None:
        return why
    return None if view.nbytes == codec.page_bytes else SHORT


# ---------------------------------------------------------------- writes

@dataclass(frozen=True, slots=True)
class WriteResult:
    """What a write did: keys the store accepted, refused, skipped as present, and how many
    of the stored ones were bad keys rewritten (healed)."""

    stored: list[str]
    failed: list[str]
    skipped: int = 0
    healed: int = 0

    @property
    def ok(self) -> bool:
        return not self.failed


def write(store: Store, parts: Sequence[PageFrames], *, skip_present: bool = False,
          bad: BadKeys | None = None,
          known: Sequence[Sequence[bool]] | None = None) -> WriteResult:
    """Encode every part's frames in place (their payloads already gathered) and store them
    with one ``put``. With ``skip_present`` pages the store reports present are not sent,
    except keys in ``bad`` (found bad here): a recomputed page overwrites a bad or missing
    key, never skipped. ``known``: per part the flags ``present`` gave the caller just
    before (no second query). Keys written are forgotten by ``bad``."""
    items: dict[str, memoryview] = {}
    skipped = 0
    for i, part in enumerate(parts):
        frames, codec, keys = part.frames, part.codec, list(part.keys)
        if not (skip_present and keys):
            there = [False] * len(keys)
        elif known is not None:
            there = list(known[i])
        else:
            there = present(store, keys, bad)
        if not any(there):
            items.update(zip(keys, codec.encode_frames(frames.block(), frames.stride, keys)))
            continue
        for key, frame, found in zip(keys, frames.frames(), there):
            if found:  # NOTE: neither encoded nor sent again
                skipped += 1
            else:
                items[key] = codec.encode_into(frame, key)
    # NOTE: the store copies or writes the views before put returns (Store contract), so the
    # staging buffer may go back to its arena right after.
    results = store.put(items) if items else []
    stored: list[str] = []
    failed: list[str] = []
    for key, ok in zip(items, results):
        (stored if ok else failed).append(key)
    healed = len(bad.discard(stored)) if bad is not None else 0
    return WriteResult(stored=stored, failed=failed, skipped=skipped, healed=healed)
