"""``mooncake://MASTER_HOST:PORT?metadata=...``: pages in an existing Mooncake Store cluster.

Owns the mapping of the ``Store`` calls onto the Mooncake client's batch API (through one
registered staging buffer), its result codes, and the per-call time budget. URL options live
in ``mooncake_options.py``, the master's admin HTTP in ``mooncake_admin.py``.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np

from radixlink.errors import StoreError
from radixlink.stores.base import Store, copy_into
from radixlink.stores.keys import KEY_PREFIX
from radixlink.stores.mooncake_admin import MasterAdmin
from radixlink.stores.mooncake_options import MooncakeOptions, parse_url

MISSING = -704  # OBJECT_NOT_FOUND
TOO_SMALL = -600  # INVALID_PARAMS: the value is longer than the buffer
# NOTE: RPC_FAIL (the master is gone) and TRANSFER_FAIL (a segment holder is gone) are the
# backend failing, not a missing page: a StoreError, so the linker's breaker sees them.
FAILED = (-900, -800)
INSTALL_HINT = ("mooncake:// needs the Mooncake client: pip install 'radixlink[mooncake]' "
                "(and, on Debian/Ubuntu, apt-get install libibverbs1)")
_T = TypeVar("_T")


def buffer_address(value: Any) -> int:
    """The address of a bytes-like value's first byte (read-only ``bytes`` included)."""
    return int(np.frombuffer(value, dtype=np.uint8).ctypes.data)


def _client_class() -> Any:
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT}: {exc}") from exc
    return MooncakeDistributedStore


class MooncakeStore(Store):
    """Pages as Mooncake objects: a batch is one ``batch_*`` client call per staging-full.

    ``put`` never overwrites in Mooncake and its in-place ``upsert`` tears pages under
    readers, so a put removes the keys first, then writes them (a reader in between sees a
    miss). Reads and writes go through one registered staging buffer, used by one call at a
    time. Every client call runs on a small thread pool and waits at most ``timeout_s``:
    a dead master (about 4.3 s per call) costs a caller the budget, then ``StoreError``.

    Args:
        client: a set-up ``MooncakeDistributedStore``.
        options: the URL's options (budget, staging size, admin address).
        read_only: refuse writes (``put`` stores nothing, ``delete`` raises).
    """

    def __init__(self, client: Any, options: MooncakeOptions, *, read_only: bool = False):
        self.client = client
        self.options = options
        self.read_only = read_only
        self.where = f"mooncake://{options.master}"
        self.admin = MasterAdmin(options.admin, options.timeout_s)
        self._staging = bytearray(options.staging_bytes)
        self._view = memoryview(self._staging)
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self._staging))
        self._staging_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="radixlink-mooncake")
        self._lock = threading.Lock()
        self._counts = {"hits": 0, "misses": 0, "puts": 0, "put_failures": 0, "errors": 0,
                        "timeouts": 0}
        self._get_len = 1 << 16  # slot for a get of unknown length: the longest value seen
        self._closed = False
        if client.register_buffer(self._base, len(self._staging)) != 0:
            raise StoreError(f"{self.where}: cannot register {len(self._staging)} bytes of "
                             "staging; lower staging=")

    @classmethod
    def from_url(cls, url: str, *, read_only: bool = False) -> MooncakeStore:
        """``mooncake://HOST:PORT?metadata=...&segment=0&...`` (docs/stores.md); every option
        is checked before the client is set up."""
        options = parse_url(url, dict(os.environ))
        client = _client_class()()
        os.environ.update(options.environment())
        code = client.setup(*options.setup_args())
        if code != 0:
            raise StoreError(f"mooncake://{options.master}: client setup failed with code "
                             f"{code} (master reachable? metadata={options.metadata!r} right? "
                             f"advertise={options.advertise!r} this host's address?)")
        store = cls(client, options, read_only=read_only)
        store._page_secret = options.secret
        return store

    def _call(self, op: str, fn: Callable[[], _T],
              on_late: Callable[[Future[Any]], None] | None = None) -> _T:
        """``fn()`` on the pool, within the budget; a late or failed call is a StoreError
        (``on_late`` gets the future of a call still running in the client)."""
        if self._closed:
            raise StoreError(f"{op} on {self.where}: the store is closed")
        future = self._pool.submit(fn)
        try:
            return future.result(timeout=self.options.timeout_s)
        except FutureTimeout:
            if on_late is not None:
                on_late(future)
            self._count(timeouts=1)
            raise StoreError(f"{op} on {self.where}: no answer within timeout="
                             f"{self.options.timeout_s}s") from None
        except Exception as exc:  # noqa: BLE001 - any client failure is a store failure
            raise StoreError(f"{op} on {self.where} failed: {type(exc).__name__}: "
                             f"{exc}") from exc

    @contextmanager
    def _staged(self, op: str) -> Iterator[Callable[[Callable[[], _T]], _T]]:
        """Hold the staging for one batch; a call that overruns the budget keeps holding it
        until the client returns (it may still be reading or writing there)."""
        if not self._staging_lock.acquire(timeout=self.options.timeout_s):
            self._count(timeouts=1)
            raise StoreError(f"{op} on {self.where}: staging busy past timeout="
                             f"{self.options.timeout_s}s (an earlier call is stuck)")
        held = [True]

        def late(future: Future[Any]) -> None:
            held[0] = False
            future.add_done_callback(lambda _: self._staging_lock.release())

        try:
            yield lambda fn: self._call(op, fn, late)
        finally:
            if held[0]:
                self._staging_lock.release()

    def _chunks(self, sizes: Sequence[int]) -> Iterator[tuple[int, int]]:
        """``[start, end)`` runs of ``sizes`` that fit the staging together (one value larger
        than the staging is a run of its own, for the caller to refuse)."""
        start, used = 0, 0
        for i, size in enumerate(sizes):
            if i > start and used + size > len(self._staging):
                yield start, i
                start, used = i, 0
            used += size
        if start < len(sizes):
            yield start, len(sizes)

    def _check(self, op: str, codes: Sequence[int], keys: Sequence[str]) -> list[int]:
        codes = list(codes)
        if len(codes) != len(keys):
            raise StoreError(f"{op} on {self.where}: {len(codes)} results for {len(keys)} keys")
        failed = next((code for code in codes if code in FAILED), None)
        if failed is not None:
            self._count(errors=1)
            raise StoreError(f"{op} on {self.where} failed with code {failed} (-900: master "
                             "unreachable, -800: a segment holder unreachable)")
        return codes

    def exists(self, keys: Sequence[str]) -> list[bool]:
        if not keys:
            return []
        keys = list(keys)
        codes = self._check("exists", self._call("exists", lambda: self.client.batch_is_exist(
            keys)), keys)
        if any(code < 0 for code in codes):
            self._count(errors=1)
            raise StoreError(f"exists on {self.where}: codes {sorted(set(codes))}")
        return [code == 1 for code in codes]

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        slot = min(self._get_len, len(self._staging))
        buffers = [memoryview(bytearray(slot)) for _ in keys]
        sizes = self.get_into(keys, buffers)
        return [None if n is None else bytes(buf[:n]) if n <= slot else self._get_one(key)
                for key, buf, n in zip(keys, buffers, sizes, strict=True)]

    def _get_one(self, key: str) -> bytes | None:
        """One whole value of any length (the client's own buffer): ``get``'s slow path."""
        value = self._call("get", lambda: self.client.get(key))
        return bytes(value) if value else None  # NOTE: b'' is a miss (or a failure)

    def get_into(self, keys: Sequence[str], buffers: Sequence[memoryview]) -> list[int | None]:
        if len(keys) != len(buffers):
            raise ValueError(f"get_into: {len(keys)} keys but {len(buffers)} buffers; pass one "
                             "buffer per key")
        out: list[int | None] = []
        sizes = [buf.nbytes for buf in buffers]
        for start, end in self._chunks(sizes):
            out += self._get_chunk(keys[start:end], buffers[start:end], sizes[start:end])
        hits = sum(n is not None for n in out)
        self._count(hits=hits, misses=len(out) - hits)
        return out

    def _get_chunk(self, keys: Sequence[str], buffers: Sequence[memoryview],
                   sizes: list[int]) -> list[int | None]:
        keys = list(keys)
        if sum(sizes) > len(self._staging):  # one buffer larger than the staging
            return [copy_into(buffers[0], self._get_one(keys[0]))]
        offsets = [0]
        for size in sizes[:-1]:
            offsets.append(offsets[-1] + size)
        ptrs = [self._base + off for off in offsets]
        with self._staged("get") as call:
            codes = self._check("get", call(lambda: self.client.batch_get_into(
                keys, ptrs, sizes)), keys)
            out: list[int | None] = []
            for buf, off, code in zip(buffers, offsets, codes, strict=True):
                if code >= 0:
                    buf[:code] = self._view[off : off + code]
                    out.append(code)
                elif code == TOO_SMALL:
                    out.append(-1)  # filled in below, outside the staging
                else:
                    out.append(None)  # MISSING, or a per-page failure: a miss either way
            self._count(errors=sum(code < 0 and code not in (MISSING, TOO_SMALL)
                                   for code in codes))
        for i, n in enumerate(out):
            if n == -1:
                value = self._get_one(keys[i])
                out[i] = copy_into(buffers[i], value)
                if value is not None:
                    self._get_len = max(self._get_len, len(value))
        return out

    def put(self, items: Mapping[str, Any]) -> list[bool]:
        if not items:
            return []
        if self.read_only:
            self._count(puts=len(items), put_failures=len(items))
            return [False] * len(items)
        keys = list(items)
        views = [value if type(value) is bytes else memoryview(value).cast("B")
                 for value in items.values()]
        sizes = [len(view) for view in views]
        out: list[bool] = []
        for start, end in self._chunks(sizes):
            out += self._put_chunk(keys[start:end], views[start:end], sizes[start:end])
        self._get_len = max(self._get_len, max(sizes))
        self._count(puts=len(out), put_failures=out.count(False))
        return out

    def _put_chunk(self, keys: list[str], views: Sequence[Any], sizes: list[int]) -> list[bool]:
        # NOTE: Mooncake's put keeps an existing value (returns 0) and upsert rewrites in place
        # under readers: replacing is remove (force: a reader's lease would refuse it), then put.
        remove = lambda: self.client.batch_remove(keys, True)  # noqa: E731
        if self.options.direct_put:
            # NOTE: over TCP the client reads any address: sending from the caller's buffers
            # saves a copy (~15% of a 1 MiB put here). A put still reading a buffer after its
            # budget may send bytes the caller reused: the codec rejects such a page as a miss.
            ptrs = [buffer_address(view) for view in views]
            self._check("put", self._call("put", remove), keys)
            codes = self._check("put", self._call("put", lambda: self.client.batch_put_from(
                keys, ptrs, sizes)), keys)
            return [code == 0 for code in codes]
        if sum(sizes) > len(self._staging):
            return [False]  # one value larger than the staging
        ptrs, off = [], 0
        with self._staged("put") as call:
            for view, size in zip(views, sizes, strict=True):
                self._view[off : off + size] = view
                ptrs.append(self._base + off)
                off += size
            self._check("put", call(remove), keys)
            codes = self._check("put", call(lambda: self.client.batch_put_from(
                keys, ptrs, sizes)), keys)
        return [code == 0 for code in codes]

    def delete(self, keys: Sequence[str]) -> int:
        if not keys:
            return 0
        if self.read_only:
            raise StoreError(f"the store at {self.where} was opened read-only")
        keys = list(keys)
        codes = self._check("delete", self._call("delete", lambda: self.client.batch_remove(
            keys, True)), keys)
        return sum(code == 0 for code in codes)

    def scan(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """Every key under ``prefix`` the master lists (any client's), with its size."""
        keys = [key for key in self.admin.keys() if key.startswith(prefix)]
        yield from self.admin.sizes(keys)

    def clear(self, prefix: str = "") -> int:
        """Delete radixlink's keys under ``prefix``; other clients' keys (SGLang HiCache,
        vLLM) sharing the cluster stay, even for ``prefix=""``."""
        keys = [key for key in self.admin.keys()
                if key.startswith(prefix) and key.startswith(KEY_PREFIX)]
        return sum(self.delete(keys[i : i + 1024]) for i in range(0, len(keys), 1024))

    def stats(self) -> dict[str, Any]:
        summary = self.admin.summary()
        with self._lock:
            counts = dict(self._counts)
        return {"where": self.where, **summary, **counts}

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] += delta

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        pool, client, base = self._pool, self.client, self._base

        def shut() -> None:
            pool.shutdown(wait=True)  # NOTE: closing under a call still in the client crashes
            client.unregister_buffer(base)
            client.close()

        # NOTE: a client takes 0.7 s to close (6 s with its master gone, longer behind a stuck
        # call); a thread finishes it in the background (the interpreter joins it at exit).
        threading.Thread(target=shut, name="radixlink-mooncake-close").start()

    def __repr__(self) -> str:
        return f"MooncakeStore({self.where})"
