"""``file:///path?capacity=50GiB``: one file per page in sharded subdirectories, LRU-capped.

Owns the store primitives over the on-disk layout (dirlayout.py: sharded paths, leaf
directories, the walk). Safe with several processes sharing one directory (see docs/stores.md
for how the cap behaves then). The LRU index, capacity and free-space floor live in
pageindex.py; file-level safety (no links, no FIFOs, size limits, atomic writes) in
pagefiles.py.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import unquote

from radixlink.errors import StoreError
from radixlink.stores import pagefiles
from radixlink.stores.base import Store
from radixlink.stores.dirlayout import ShardLayout, unusable
from radixlink.stores.pageindex import PageIndex, bytes_short
from radixlink.stores.params import AUTH, Param, read_params, size, size_or_percent
from radixlink.stores.registry import parse_size, split_url

logger = logging.getLogger(__name__)

DEFAULT_CAPACITY = "50GiB"
DEFAULT_MAX_PAGE = "64MiB"
DEFAULT_MIN_FREE = "2%"
TOUCH_AFTER_S = 600.0  # a read refreshes a page's mtime at most this often
_SPACE_ERRORS = (errno.ENOSPC, errno.EDQUOT)
# NOTE: unlink errors of one page name, not of the store: a directory there, or a file we may
# not remove (a sticky or locked-down shard, another user's file), which another writer of
# the directory put there. Counted and skipped; any other error (the root became a file, EIO)
# is the store failing.
_PAGE_UNLINK_ERRORS = (errno.EISDIR, errno.EPERM, errno.EACCES, errno.EBUSY)

PARAMS = {
    "capacity": Param(
        size(1), parse_size(DEFAULT_CAPACITY), "a size from 1 byte to 8 EiB, such as 50GiB"
    ),
    "max_page_bytes": Param(
        size(64), parse_size(DEFAULT_MAX_PAGE), "a size from 64 bytes to 8 EiB, such as 64MiB"
    ),
    "min_free": Param(
        size_or_percent(50.0), None, "a size such as 10GiB, or 0% to 50% of the filesystem"
    ),
    "auth": AUTH,
}


def default_store_url() -> str:
    """The embedded default store: a directory under the user's cache."""
    return "file://~/.cache/radixlink/store"


class DirectoryStore(Store):
    """Pages as files ``<root>/<aab>/<escaped key>``: ``aab``, 12 bits of the key's crc32,
    picks one of 4096 leaf directories (created on first use; ``/`` and ``%`` in the key are
    percent-escaped in the file name). Opened writable, it first moves the leaves of the
    two-level layout of earlier versions (``<aa>/<b>``) to their one-level names.

    Writes go to a temp file in the same directory, then ``os.replace`` it over the page, so
    readers (any process) see a complete old or new page, never a partial one, and concurrent
    writers of one key leave one of the complete values. No fsync: after a power loss a torn
    page fails the codec's length/checksum check and reads as a miss.

    Files are untrusted input: symlinks are never followed (nor their targets touched), only
    regular files of at most ``max_page_bytes`` are read, and opening a FIFO cannot block.

    The LRU index (key -> size) is rebuilt once on open from file mtimes and kept in memory;
    put, get and exists update it, so no operation walks the tree. A read hit refreshes the
    file's mtime (at most every ``TOUCH_AFTER_S``), so LRU order survives restarts to within
    that many seconds. Least recently used pages are deleted past ``capacity_bytes``, when a
    write would leave less than ``min_free`` on the filesystem, and on ENOSPC (then the write
    is retried once).

    Args:
        root: the directory (created if missing, unless ``read_only``).
        capacity_bytes: least recently used pages are deleted past this many bytes.
        max_page_bytes: the largest page file read or written.
        min_free: free space kept on the filesystem: bytes, or ``"N%"`` of its size.
        read_only: inspect only: no directory created, no eviction, no temp clean-up, no
            mtime refresh; ``put`` stores nothing (False, counted) and ``delete`` raises.

    Raises:
        ValueError: the path is under /proc, /sys or /dev, or is not a directory.
        StoreError: the directory cannot be created, or does not exist (``read_only``).
    """

    scatters = True  # NOTE: one readv into a page's pieces, as into one staging frame
    reads_in_parts = True  # NOTE: with ``part``, one readv per run of pagefiles.PART_BYTES

    def __init__(
        self,
        root: str | os.PathLike[str],
        capacity_bytes: int = parse_size(DEFAULT_CAPACITY),
        *,
        max_page_bytes: int = parse_size(DEFAULT_MAX_PAGE),
        min_free: int | str = DEFAULT_MIN_FREE,
        read_only: bool = False,
    ):
        if capacity_bytes <= 0 or max_page_bytes <= 0:
            raise ValueError(f"capacity and max_page_bytes must be > 0 bytes, got "
                             f"{capacity_bytes} and {max_page_bytes}")
        self.root = pagefiles.check_root(os.fspath(root))
        self.capacity_bytes = capacity_bytes
        self.max_page_bytes = max_page_bytes
        self.read_only = read_only
        self.min_free = str(min_free).strip()
        self._min_free = size_or_percent(50.0)(self.min_free)  # ("percent", 2.0) / ("bytes", n)
        if read_only:
            if not os.path.isdir(self.root):
                raise StoreError(f"no store directory at {self.root!r}; check the URL's path")
        else:
            try:
                os.makedirs(self.root, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot use {self.root!r} as a store directory: "
                                 f"{exc.strerror or exc}; choose a writable path") from exc
        self._index = PageIndex()
        self._layout = ShardLayout(self.root)
        self._tag = f"{os.getpid()}.{secrets.token_hex(4)}"
        self._seq = itertools.count()
        if read_only:
            self._old_leaves = len(self._layout.old_leaves())
            if self._old_leaves:
                logger.warning(
                    "the directory store %r holds %d leaf directories of the two-level layout "
                    "of earlier versions; their pages read as misses until it is opened "
                    "writable once (radixlink store gc URL)", self.root, self._old_leaves)
        else:
            self._old_leaves = self._layout.upgrade()
        self.gc()

    @classmethod
    def from_url(cls, url: str, *, read_only: bool = False) -> DirectoryStore:
        """``file:///abs/path?capacity=50GiB&max_page_bytes=64MiB&min_free=2%&auth=env:NAME``
        or ``file://~/relative/to/home``."""
        scheme, rest, params = split_url(url)
        options = read_params(scheme, params, PARAMS)
        store = cls(
            pagefiles.root_of_url(rest),
            options["capacity"],
            max_page_bytes=options["max_page_bytes"],
            min_free=params.get("min_free", DEFAULT_MIN_FREE),  # checked by read_params
            read_only=read_only,
        )
        store._page_secret = options["auth"]
        return store

    def path_of(self, key: str) -> str:
        """The file that holds ``key`` (whether or not it exists)."""
        return self._layout.locate(key)[1]

    def exists(self, keys: Sequence[str]) -> list[bool]:
        # NOTE: an lstat per key rather than the index: other processes write here too.
        paths, _ = self._layout.read_paths(keys)
        try:
            sizes = [
                None if path is None else pagefiles.page_size_on_disk(path, self.max_page_bytes)
                for path in paths
            ]
        except OSError as exc:
            raise unusable(self.root, "exists", exc) from exc
        self._index.observe(keys, sizes, touch=False)
        return [size is not None for size in sizes]

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        out: list[bytes | None] = []
        touch_before = None if self.read_only else time.time() - TOUCH_AFTER_S
        paths, refused = self._layout.read_paths(keys)
        errors = 0
        for path in paths:
            try:
                out.append(None if path is None else
                           pagefiles.read_page(path, self.max_page_bytes, touch_before))
            except FileNotFoundError:
                out.append(None)
            except pagefiles.NotAPage:
                refused += 1
                out.append(None)
            except OSError:
                errors += 1
                out.append(None)
        self._index.count_read_misses(refused, errors)
        self._index.observe(keys, [len(v) if v is not None else None for v in out], touch=True)
        return out

    def get_into(self, keys: Sequence[str], buffers: Sequence[memoryview]) -> list[int | None]:
        """Read each page file straight into its buffer (``readv``; no bytes object per
        page), with ``get``'s rules for untrusted files; see ``Store.get_into``."""
        if len(keys) != len(buffers):
            raise ValueError(f"get_into: {len(keys)} keys but {len(buffers)} buffers; pass one "
                             "buffer per key")
        return self._read_into(keys, [[buffer] for buffer in buffers])

    def get_scattered(self, keys: Sequence[str], targets: Sequence[Sequence[memoryview]],
                      each: Callable[[int, int | None], None] | None = None,
                      part: Callable[[int, int], None] | None = None,
                      ) -> list[int | None]:
        """Read each page file straight into its pieces (one ``readv``, or with ``part`` one
        per run of ``pagefiles.PART_BYTES``: no staging between the page cache and the
        pools), with ``get``'s rules for untrusted files; ``each`` runs after each file's
        read, before the next one's; see ``Store.get_scattered``."""
        if len(keys) != len(targets):
            raise ValueError(f"get_scattered: {len(keys)} keys but {len(targets)} piece lists; "
                             "pass one list of buffers per key")
        return self._read_into(keys, targets, each, part)

    def get_scattered_xxh3(self, keys: Sequence[str], targets: Sequence[Sequence[memoryview]],
                           ) -> tuple[list[int | None], list[int | None]] | None:
        """``get_scattered``'s reads in the compiled loop (``pagefiles.read_pages_xxh3``),
        or None where it is not built; see ``Store.get_scattered_xxh3``."""
        if len(keys) != len(targets):
            raise ValueError(f"get_scattered_xxh3: {len(keys)} keys but {len(targets)} piece "
                             "lists; pass one list of buffers per key")
        read = self._read(keys, lambda paths, touch_before: pagefiles.read_pages_xxh3(
            paths, targets, self.max_page_bytes, touch_before))
        return None if read is None else (read[0], read[3])

    def _read_into(self, keys: Sequence[str], targets: Sequence[Sequence[memoryview]],
                   each: Callable[[int, int | None], None] | None = None,
                   part: Callable[[int, int], None] | None = None) -> list[int | None]:
        read = self._read(keys, lambda paths, touch_before: pagefiles.read_pages_into(
            paths, targets, self.max_page_bytes, touch_before, each, part))
        return read[0]

    def _read(self, keys: Sequence[str], read: Callable[[list[str | None], float | None], Any],
              ) -> Any:
        """``read(paths, touch_before)``, a ``pagefiles`` read of the keys' page files, with
        its refusals, errors and hits counted; what it returned (None: no read, nothing
        counted)."""
        touch_before = None if self.read_only else time.time() - TOUCH_AFTER_S
        paths, unsafe = self._layout.read_paths(keys)
        result = read(paths, touch_before)
        if result is not None:
            sizes, refused, errors = result[:3]
            self._index.count_read_misses(unsafe + refused, errors)
            self._index.observe(keys, sizes, touch=True)
        return result

    def put(self, items: Mapping[str, Any]) -> list[bool]:
        views = [(key, memoryview(value).cast("B")) for key, value in items.items()]
        if self.read_only:
            for _ in views:
                self._index.count_put_error(errno.EROFS)
            self._index.count("puts", len(views))
            return [False] * len(views)
        allowed = self._make_room(sum(view.nbytes for _, view in views))
        out, retry = [], True
        for key, view in views:
            allowed -= view.nbytes
            code = self._write(key, view) if allowed >= 0 else errno.ENOSPC
            if code in _SPACE_ERRORS and retry:
                # NOTE: disk full (or quota): free what this batch still needs, retry once
                retry = False
                if self._evict_bytes(view.nbytes + max(allowed, 0)) > 0:
                    code = self._write(key, view)
            if code:
                self._index.count_put_error(code)
            out.append(code == 0)
        written = ((key, view.nbytes) for (key, view), ok in zip(views, out, strict=True) if ok)
        victims = self._index.add_puts(written, len(out), self.capacity_bytes)
        self._unlink(victims)
        return out

    def delete(self, keys: Sequence[str]) -> int:
        if self.read_only:
            raise StoreError(f"the store at {self.root!r} was opened read-only")
        self._index.remove(keys)
        return self._unlink(keys)

    def stats(self) -> dict[str, Any]:
        index = self._index.stats()
        return {
            "root": self.root,
            "pages": index.pop("pages"),
            "bytes": index.pop("bytes"),
            "capacity_bytes": self.capacity_bytes,
            "max_page_bytes": self.max_page_bytes,
            "min_free": self.min_free,
            "read_only": self.read_only,
            "sealed": self.page_secret is not None,
            "old_layout_leaves": self._old_leaves,  # not yet moved (upgrade); misses
            **index,  # the counters, then put_errors and unlink_errors
        }

    def scan(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        for _, name, size_, _ in self._layout.walk(self.max_page_bytes, remove_temps=False):
            key = unquote(name)
            if key.startswith(prefix):
                yield key, size_

    def gc(self) -> int:
        """Rescan the directory (catching other processes' writes); unless read-only, delete
        stale temp files and least recently used pages past the capacity. Returns the pages
        deleted."""
        found = sorted(self._layout.walk(self.max_page_bytes, remove_temps=not self.read_only),
                       key=lambda entry: entry[3])
        victims = self._index.rebuild(((unquote(name), size_) for _, name, size_, _ in found),
                                      None if self.read_only else self.capacity_bytes)
        return self._unlink(victims)

    # ---------------------------------------------------------------- writing and space

    def _write(self, key: str, view: memoryview) -> int:
        """Write one page atomically; 0, or the errno of the failure."""
        if view.nbytes > min(self.capacity_bytes, self.max_page_bytes):
            return errno.EFBIG
        layout = self._layout
        shard, path = layout.locate(key)
        tmp = f"{layout.leaves[shard]}/.{self._tag}.{next(self._seq)}.tmp"
        try:
            if layout.leaf_state(shard) != "ok" and not layout.make_leaf(shard):
                return errno.ELOOP  # a shard directory is a link: write nothing through it
            layout.remember(key, path)
            pagefiles.write_page(path, tmp, view)
        except OSError as exc:
            return exc.errno or errno.EIO
        return 0

    def _make_room(self, batch_bytes: int) -> int:
        """Evict least recently used pages so that writing ``batch_bytes`` leaves the
        ``min_free`` floor; returns how many of those bytes may be written."""
        short = bytes_short(self.root, self._min_free, batch_bytes)
        if short <= 0:
            return batch_bytes
        return batch_bytes - max(0, short - self._evict_bytes(short))

    def _evict_bytes(self, num_bytes: int) -> int:
        """Delete least recently used pages of at least ``num_bytes``; returns bytes freed."""
        victims, freed = self._index.pop_bytes(num_bytes)
        self._unlink(victims)
        self._index.count("evicted_for_space", len(victims))
        return freed

    # ---------------------------------------------------------------- files

    def _unlink(self, keys: Sequence[str]) -> int:
        removed = 0
        for key in keys:
            try:
                os.unlink(self.path_of(key))  # NOTE: unlink removes a link, never its target
                removed += 1
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno not in _PAGE_UNLINK_ERRORS:
                    raise unusable(self.root, "unlink", exc) from exc
                self._index.count_unlink_error(exc.errno)
        return removed
