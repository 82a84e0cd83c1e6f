"""Page I/O, written once for the linker, the SGLang linker and HiCache backend, and the vLLM
worker: key templates, one codec per pool, batched get -> verify into caller-provided frames
(``Store.get_into``), encode in place -> put from staging frames, the restorable-prefix
presence query, and the one corrupt-page policy.

The policy: every page of a read that is not a whole verified page of its pool's layout is a
counted miss with its reason (``missing``, ``short``, or a codec reason: ``checksum``, ``key``
(foreign key), ``truncated``, ``fingerprint`` (wrong layout), ``auth`` (unsealed, forged) ...),
every *present* bad page of the batch is deleted from the store at once, and its key is
remembered in ``BadKeys`` so a writer that skips present pages still overwrites it with the
recomputed page.

Owns those rules. Must not touch the tree, pools or threads: callers gather into and scatter
from the frames (``stores.frames``), and decide what a miss means for their engine.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixlink.contract import PoolName
from radixlink.hashing import namespace_id as _namespace_id
from radixlink.stores.base import Store
from radixlink.stores.codec import PageCodec
from radixlink.stores.frames import Frames, frames_bytes, layout_frames
from radixlink.stores.keys import page_key

logger = logging.getLogger(__name__)

Codec = PageCodec  # NOTE: the one name callers outside stores/ use for a pool's codec
MISSING, SHORT = "missing", "short"  # reasons of misses the codec does not see
_MAX_TEMPLATES = 4096  # (namespace, pool, rank) templates cached; then the cache starts over
_MAX_BAD_KEYS = 1 << 16  # bad keys remembered until rewritten; then the set starts over
_HOLE = "{}"


def make_codec(fingerprint: str, page_bytes: int, *, secret: Any = None,
               checksum: str = "auto", mac: str | None = None) -> PageCodec:
    """The codec of one pool: pages of ``page_bytes`` under layout ``fingerprint``, sealed
    with ``secret`` (a store's ``page_secret``, which brings its MAC; or bytes and ``mac``)
    when there is one.

    Raises:
        ValueError: a bad ``page_bytes``, checksum name, secret or MAC name.
    """
    return PageCodec(fingerprint, page_bytes, checksum, secret=secret, mac=mac)


# ---------------------------------------------------------------- keys

_templates: dict[tuple[str, str, int | None], tuple[str, str]] = {}
_templates_lock = threading.Lock()


def page_keys(namespace_id: str, pool: PoolName | str, hashes: Iterable[str],
              rank: int | None = None) -> list[str]:
    """The store keys ``v<format>/<namespace id>/<hash>/<pool>[/r<rank>]`` of ``hashes``:
    the same bytes as ``keys.page_key`` per page, one string join each (the template of a
    (namespace, pool, rank) is validated once, each hash checked for ``/``: engines name
    pages with their own hashes).

    Raises:
        ValueError: a bad namespace id, pool, rank or hash (see ``keys.page_key``).
    """
    hashes = list(hashes)
    bad = next((h for h in hashes if not h or "/" in h), None)
    if bad is not None:
        raise ValueError(f"page hash {bad!r} must be non-empty hex without '/'")
    pool_value = pool.value if isinstance(pool, PoolName) else pool
    template = _templates.get((namespace_id, pool_value, rank))
    if template is None:
        head, tail = page_key(namespace_id, _HOLE, pool_value, rank).split(_HOLE)
        template = (head, tail)
        with _templates_lock:
            if len(_templates) >= _MAX_TEMPLATES:
                _templates.clear()  # NOTE: bounded with unbounded tenants (cache salts)
            _templates[(namespace_id, pool_value, rank)] = template
    head, tail = template
    return [head + h + tail for h in hashes]


class PageKeys:
    """Keys of one process's pages: its rank on every pool but the replicated ones.

    Args:
        rank: this process's tensor-parallel rank.
        replicated: whether a pool is identical on every rank (its keys carry no rank), as
            a predicate or a set of pools.
    """

    def __init__(self, rank: int = 0,
                 replicated: Callable[[PoolName], bool] | Iterable[PoolName] = ()):
        if not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank must be a non-negative int, got {rank!r}")
        self.rank = rank
        if not callable(replicated):
            replicated = frozenset(replicated).__contains__
        self._replicated = replicated
        self._templates: dict[tuple[PoolName, Any], tuple[str, str]] = {}

    def rank_of(self, pool: PoolName) -> int | None:
        """The rank part of ``pool``'s keys (None: replicated)."""
        return None if self._replicated(pool) else self.rank

    def writes(self, pool: PoolName) -> bool:
        """Whether this rank writes ``pool`` (replicated pools: rank 0 only)."""
        return self.rank == 0 or not self._replicated(pool)

    def keys(self, pool: PoolName, namespace: Any, hashes: Iterable[str]) -> list[str]:
        """The keys of ``hashes`` of ``pool`` in ``namespace``: a namespace id (str) or what
        ``hashing.namespace_id`` takes (None, a ``Namespace``, a tuple of parts). One string
        join per page (the per-(pool, namespace) template is built once)."""
        template = self._templates.get((pool, namespace))
        if template is None:
            template = self._template(pool, namespace)
        head, tail = template
        return [head + h + tail for h in hashes]

    def _template(self, pool: PoolName, namespace: Any) -> tuple[str, str]:
        ns_id = namespace if isinstance(namespace, str) else _namespace_id(namespace)
        head, tail = page_key(ns_id, _HOLE, pool, self.rank_of(pool)).split(_HOLE)
        if len(self._templates) >= _MAX_TEMPLATES:
            self._templates.clear()  # NOTE: bounded with unbounded tenants (cache salts)
        self._templates[(pool, namespace)] = (head, tail)
        return head, tail


def leading_present(flags: Sequence[bool]) -> int:
    """How many leading pages of a key chain are present (``flags`` from ``present``)."""
    return next((i for i, ok in enumerate(flags) if not ok), len(flags))


# ---------------------------------------------------------------- the corrupt-page record

class BadKeys:
    """Keys found bad here (deleted from the store) and not rewritten since: a writer that
    skips pages the store reports present still writes these. Bounded; thread-safe."""

    def __init__(self, capacity: int = _MAX_BAD_KEYS) -> None:
        self._keys: set[str] = set()
        self._capacity = capacity
        self._lock = threading.Lock()

    def add(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        with self._lock:
            if len(self._keys) + len(keys) > self._capacity:
                self._keys.clear()  # NOTE: bounded memory; a forgotten key heals later
            self._keys.update(keys)

    def discard(self, keys: Iterable[str]) -> list[str]:
        """Forget ``keys`` (rewritten); the ones that were bad."""
        if not self._keys:
            return []
        with self._lock:
            healed = [k for k in keys if k in self._keys]
            self._keys.difference_update(healed)
        return healed

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def mask(self, keys: Sequence[str], flags: Sequence[bool]) -> list[bool]:
        """``flags`` with every bad key's flag cleared (a failed delete still reads absent)."""
        if not self._keys:
            return list(flags)
        with self._lock:
            return [ok and key not in self._keys for key, ok in zip(keys, flags)]


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


def stage_pages(arena: Any, pools: Sequence[tuple[PageCodec, Sequence[str]]]
                ) -> tuple[tuple[Any, memoryview], list[PageFrames]]:
    """Staging from ``arena`` (a ``memory.host.StagingArena``) for ``(codec, keys)`` per
    pool: one buffer, one ``PageFrames`` per pool. Give it back with
    ``arena.release(*staging)`` once its pages are written, or landed."""
    sizes = []
    for codec, keys in pools:
        sizes.append((len(keys), codec.page_bytes, codec.frame_bytes))
    staging = arena.acquire(frames_bytes(sizes))
    parts = []
    for (codec, keys), frames in zip(pools, layout_frames(staging[0], staging[1], sizes)):
        parts.append(PageFrames(codec, keys, frames))
    return staging, parts


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
    bad_keys: list[str] = []
    num_bytes = pos = num_bad = 0
    for part in parts:
        codec, page_bytes = part.codec, part.codec.page_bytes
        for key in part.keys:
            why = _verify(codec, frames[pos], sizes[pos], key)
            pos += 1
            reasons.append(why)
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
          bad: BadKeys | None = None) -> WriteResult:
    """Encode every part's frames in place (their payloads already gathered) and store them
    with one ``put``. With ``skip_present`` pages the store reports present are not sent,
    except keys in ``bad`` (found bad here): a recomputed page overwrites a bad or missing
    key, never skipped. Keys written are forgotten by ``bad``."""
    items: dict[str, memoryview] = {}
    skipped = 0
    for part in parts:
        frames, codec, keys = part.frames, part.codec, list(part.keys)
        there = present(store, keys, bad) if skip_present and keys else [False] * len(keys)
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
