"""The ``Store`` interface every backend implements (DESIGN.md section 6b).

Owns the contract only. Stores hold opaque bytes (codec payloads) under string keys; they know
nothing of the tree, the linker or the page format.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from radixlink.stores.keys import is_page_key

_S = TypeVar("_S", bound="Store")


class Store(ABC):
    """A page store: batch presence, batch get, batch put, delete, stats, close.

    Batches are the API: every call takes many keys, and backends answer a batch in as few
    round trips as they can (one pipeline for Redis). Results are in the order of the keys.

    Contract for every backend:
        - Each page is atomic: a reader sees a complete old value, a complete new value, or
          nothing; never a partial page.
        - Missing keys are an expected "no": ``False`` / ``None``, never an exception.
        - A failed write of one page (disk full, value too large, read-only directory) is a
          ``False`` in ``put``'s result and counted in ``stats()``; it does not raise.
        - A failure of the backend as a whole (connection lost, store unusable) raises
          ``StoreError`` from the backend's exception. The next call may succeed (Redis
          reconnects).
        - All methods are thread-safe. The store evicts on its own (capacity), so a page
          present now may be gone on the next call.
    """

    # NOTE: set once by ``from_url`` (``auth=``); None means pages are not sealed.
    _page_secret: bytes | None = None

    #: Whether every call is in-process memory work that never waits (no I/O, no lock held
    #: by another process). The linker then writes offloads on the engine thread instead of
    #: a worker thread: with nothing to overlap, a thread would only contend for the GIL.
    #: A subclass that adds waiting (I/O, injected delays) must set it back to False.
    in_process: bool = False

    #: Whether other processes can reach this store's pages (a directory, Redis). Only a
    #: store private to this process (``memory://``) sets it False; a wrapper answers for
    #: what it wraps. A linker on a shared store needs a model namespace.
    shared: bool = True

    #: Whether ``get_scattered`` costs no more copies than ``get_into`` (a directory reads
    #: straight into the pieces; memory copies once from its values). A load into pools the
    #: pages' bytes are spread over then reads into them directly instead of through staging.
    scatters: bool = False

    #: Whether ``get_scattered`` calls ``part`` as a large value's pieces fill (a directory
    #: reads a page file in runs): a load then checks each run while it is in cache.
    reads_in_parts: bool = False

    @property
    def page_secret(self) -> bytes | None:
        """The secret pages in this store are sealed with (the URL's ``auth=``), or None.

        Read-only. The linker gives it to its page codecs; it never appears in ``repr``,
        ``stats()`` or error messages.
        """
        return self._page_secret

    @abstractmethod
    def exists(self, keys: Sequence[str]) -> list[bool]:
        """Per-key presence. Does not count as a use for LRU purposes."""

    @abstractmethod
    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        """The stored value of each key, or None where it is missing. A hit is a use (LRU)."""

    def get_into(self, keys: Sequence[str], buffers: Sequence[memoryview]) -> list[int | None]:
        """Read each key's value into the start of its buffer: the fast path of loads, which
        land pages in a reusable staging buffer instead of a new ``bytes`` per page.

        Args:
            keys: the keys, as for ``get``.
            buffers: one writable byte view per key.

        Returns:
            Per key its value's length (``buffers[i][:n]`` holds it), or None where it is
            missing. A value longer than its buffer fills the buffer with its first bytes
            (enough to read a page header) and its whole length is returned, so the caller
            can tell it apart without reading the rest.

        Raises:
            ValueError: ``keys`` and ``buffers`` differ in length.

        The default copies from ``get``; memory and directory stores read straight into the
        buffers. A hit is a use (LRU), as for ``get``.
        """
        if len(keys) != len(buffers):
            raise ValueError(f"get_into: {len(keys)} keys but {len(buffers)} buffers; pass one "
                             "buffer per key")
        return [copy_into(buf, value) for buf, value in zip(buffers, self.get(keys))]

    def get_scattered(self, keys: Sequence[str], targets: Sequence[Sequence[memoryview]],
                      each: Callable[[int, int | None], None] | None = None,
                      part: Callable[[int, int], None] | None = None,
                      ) -> list[int | None]:
        """Read each key's value into its pieces, in order, as one ``readv`` would: the
        first ``len(pieces[0])`` bytes into ``pieces[0]``, the next into ``pieces[1]``, and
        so on. A load reads a page's header into staging and its payload straight into the
        rows of the pools it lands in, with no second copy.

        Args:
            keys: the keys, as for ``get``.
            targets: per key its writable byte views.
            each: given, ``each(i, size)`` is called on this thread once per key, in order,
                as soon as key ``i``'s value is in its pieces (``size`` as returned below),
                before the next value is read: a load checks each page while its bytes are
                still in the core's cache. An exception it raises ends the call (every file
                closed) and propagates.
            part: given, ``part(i, n)`` may be called on this thread when key ``i``'s first
                ``n`` pieces hold their bytes, before more of it is read (a caller checks a
                large value in parts while each is in cache); n grows with each call for
                one key, and every call for key ``i`` comes before ``each(i, ...)``. A store
                may never call it (this default does not); ``each`` still comes.

        Returns:
            Per key its value's length, or None where it is missing. A value longer than its
            pieces fills them with its first bytes (its length says so); a shorter one fills
            them from the first on and leaves the rest as they were.

        Raises:
            ValueError: ``keys`` and ``targets`` differ in length.

        The default copies from ``get`` (one copy, as ``get_into``'s default); ``scatters``
        says whether a backend's is as cheap as its ``get_into``. A hit is a use (LRU).
        """
        if len(keys) != len(targets):
            raise ValueError(f"get_scattered: {len(keys)} keys but {len(targets)} piece lists; "
                             "pass one list of buffers per key")
        out: list[int | None] = []
        for pieces, value in zip(targets, self.get(keys)):
            out.append(scatter_into(pieces, value))
            if each is not None:
                each(len(out) - 1, out[-1])
        return out

    def get_scattered_xxh3(self, keys: Sequence[str], targets: Sequence[Sequence[memoryview]],
                           ) -> tuple[list[int | None], list[int | None]] | None:
        """``get_scattered`` (no ``each``, no ``part``) that also hands back each value's
        xxh3 over its pieces but the first and the last (a page's payload between its header
        and its tag), computed as it was read, in one call that lets the GIL go: a load beside
        an engine's Python then never waits on it. Per key its length (as ``get_scattered``)
        and its digest, None where it was not read whole into its pieces.

        None (the default): this store has no such read; the caller uses ``get_scattered``.
        """
        return None

    @abstractmethod
    def put(self, items: Mapping[str, Any]) -> list[bool]:
        """Store every item, overwriting; True per item the store accepted, in ``items`` order.

        Values are bytes-like: ``bytes``, ``bytearray`` or a (C-contiguous) ``memoryview``,
        e.g. encoded pages in the linker's staging buffer. False means not stored (write
        error, value larger than the capacity, disk full) and is counted in ``stats()``. An
        accepted page may still be evicted later, even by the same batch when the batch alone
        exceeds the capacity. The store keeps no reference to the caller's buffers beyond the
        call unless they are immutable ``bytes``: the caller may reuse them once put returns.
        """

    @abstractmethod
    def delete(self, keys: Sequence[str]) -> int:
        """Remove the keys that exist; returns how many were removed."""

    def stats(self) -> dict[str, Any]:
        """Counters and sizes (``pages``, ``bytes``, ``capacity_bytes``, hits, misses,
        ``put_failures`` ...). Backends add their own entries."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release connections, threads and files. Idempotent; the store is unusable after."""

    def flush(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Wait until every accepted write is durable in the backend (tiered: the back store)."""

    def scan(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """Yield ``(key, stored bytes)`` for every stored key starting with ``prefix``.

        For the admin CLI and tests, not the hot path (it walks the whole store).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot list its keys")

    def gc(self) -> int:
        """Enforce the capacity now; returns the pages removed. Most stores do it on put."""
        return 0

    def clear(self, prefix: str = "") -> int:
        """Delete every radixlink page key starting with ``prefix``; returns how many were
        removed. Keys that are not radixlink's (``parse_key`` refuses them: other software on
        a shared Redis db, foreign files in the directory) are never deleted, whatever the
        prefix, even ``""``."""
        removed, batch = 0, []
        for key, _ in self.scan(prefix):
            if not is_page_key(key):
                continue
            batch.append(key)
            if len(batch) >= 1024:
                removed += self.delete(batch)
                batch = []
        return removed + (self.delete(batch) if batch else 0)

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def copy_into(buffer: memoryview, value: Any) -> int | None:
    """Copy a store value into the start of ``buffer``; its length, or None for a missing one.
    A value longer than ``buffer`` fills it with its first bytes (its length says so)."""
    if value is None:
        return None
    if type(value) is bytes and len(value) <= buffer.nbytes:
        # NOTE: the common case (a whole page from a client): copy from the bytes directly,
        # 15-20% faster than through a memoryview of it for 64 KiB values
        size = len(value)
        buffer[:size] = value
        return size
    view = memoryview(value).cast("B") if type(value) is not bytes else memoryview(value)
    size = view.nbytes
    head = min(size, buffer.nbytes)
    buffer[:head] = view[:head]
    return size


def scatter_into(pieces: Sequence[memoryview], value: Any) -> int | None:
    """Copy a store value into ``pieces`` one after another (``Store.get_scattered``); its
    length, or None for a missing one."""
    if value is None:
        return None
    view = memoryview(value)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    size, pos = view.nbytes, 0
    for piece in pieces:
        if pos >= size:
            break
        take = min(piece.nbytes, size - pos)
        piece[:take] = view[pos : pos + take]
        pos += take
    return size
