"""``redis://[:password@]host:port/db?ttl=SECONDS`` (also ``rediss://``, ``unix://``).

Owns the single-server Redis/Valkey backend: pipelined batches over redis-py (hiredis is used
automatically when installed). Capacity is Redis's own ``maxmemory`` + ``allkeys-lru``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, Sequence, Sized
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from radixlink.errors import StoreError
from radixlink.stores.base import Store, copy_into
from radixlink.stores.params import (
    AUTH,
    Param,
    boolean,
    choice,
    integer,
    number,
    read_params,
)
from radixlink.stores.registry import split_url

# NOTE: redis-py's default retries 10 times; a linker wants a dead or hung server to fail fast
# (the load is aborted and recomputed). One retry after a short jittered backoff still heals a
# stale pooled connection after a server restart. Worst case per call, with the defaults:
# (1 + retries) x socket_timeout + backoff = 2 x 1 s + <= 0.1 s.
DEFAULT_RETRIES = 1
DEFAULT_SOCKET_TIMEOUT_S = 1.0
DEFAULT_CONNECT_TIMEOUT_S = 1.0
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 0.5
_SCAN_BATCH = 1000
_SECONDS = "seconds, > 0 and at most 300"
MAX_TTL_S = 100 * 365 * 86400  # NOTE: Redis refuses an EX past ~2**63 ms; 100 years is plenty


def _client_name(value: str) -> str:
    # NOTE: Redis's CLIENT SETNAME refuses spaces, newlines and anything outside '!'..'~'
    if not value or any(not "!" <= ch <= "~" for ch in value):
        raise ValueError(value)
    return value


def _existing_path(value: str) -> str:
    if not os.path.exists(value):
        raise ValueError(value)
    return value


STORE_PARAMS: dict[str, Param] = {
    "ttl": Param(integer(1, MAX_TTL_S), None, f"an int from 1 to {MAX_TTL_S} (seconds)"),
    "retries": Param(integer(0, 10), DEFAULT_RETRIES, "an int from 0 to 10"),
    "auth": AUTH,
}
CLIENT_PARAMS: dict[str, Param] = {
    "socket_timeout": Param(number(0, 300, low_open=True), DEFAULT_SOCKET_TIMEOUT_S, _SECONDS),
    "socket_connect_timeout": Param(
        number(0, 300, low_open=True), DEFAULT_CONNECT_TIMEOUT_S, _SECONDS
    ),
    "socket_keepalive": Param(boolean, None, "true or false"),
    "health_check_interval": Param(integer(0, 3600), None, "an int from 0 to 3600 (seconds)"),
    "max_connections": Param(integer(1, 1 << 16), None, "an int from 1 to 65536"),
    "client_name": Param(_client_name, None,
                         "a non-empty name of printable ASCII without spaces (CLIENT SETNAME)"),
}
DB_PARAM = {"db": Param(integer(0), None, "an int >= 0")}
TLS_PARAMS: dict[str, Param] = {
    "ssl_cert_reqs": Param(choice("none", "optional", "required"), None,
                           "none, optional or required"),
    "ssl_ca_certs": Param(_existing_path, None, "the path of an existing CA bundle"),
    "ssl_ca_path": Param(_existing_path, None, "the path of an existing CA directory"),
    "ssl_certfile": Param(_existing_path, None, "the path of an existing certificate"),
    "ssl_keyfile": Param(_existing_path, None, "the path of an existing key file"),
    "ssl_check_hostname": Param(boolean, None, "true or false"),
}
_RETRIES_HINT = "radixlink retries by itself; use retries=N (0 to 10)"
REFUSED: dict[str, str] = {
    "decode_responses": "pages are raw bytes; radixlink never decodes responses",
    "retry_on_timeout": _RETRIES_HINT,
    "retry_on_error": _RETRIES_HINT,
}


def client_url_and_options(
    url: str, scheme: str | None = None, *, cluster: bool = False
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Check every parameter of ``url`` and split it into (client URL without query,
    redis-py keyword arguments, store options ``ttl``/``retries``/``auth``).

    Raises:
        ValueError: an unknown, refused or malformed parameter (TLS options on a URL that
            is not ``rediss://``, ``decode_responses``, a negative timeout, ...).
    """
    url_scheme, rest, params = split_url(url)
    client_scheme = scheme or url_scheme
    spec = {**STORE_PARAMS, **CLIENT_PARAMS, **({} if cluster else DB_PARAM)}
    refused = dict(REFUSED)
    tls_hint = f"TLS options apply to rediss:// URLs only; use rediss://{rest.split('/')[0]}"
    if client_scheme == "rediss":
        spec.update(TLS_PARAMS)
    else:
        refused.update(dict.fromkeys(TLS_PARAMS, tls_hint))
    if cluster:
        refused["db"] = "a Redis Cluster has database 0 only"
    db = _check_location(url_scheme, client_scheme, rest, cluster=cluster)
    if db is not None and "db" in params:
        raise ValueError(f"{url_scheme}:// store URL: the path names database {db} and "
                         f"db={params['db']!r} names another; keep one (e.g. "
                         f"{url_scheme}://host:6379/{db})")
    options = read_params(url_scheme, params, spec, refused)
    kwargs = {name: options[name] for name in spec if name not in STORE_PARAMS}
    kwargs = {name: value for name, value in kwargs.items() if value is not None}
    store_options = {name: options[name] for name in STORE_PARAMS}
    return f"{client_scheme}://{rest}", kwargs, store_options


def _check_location(
    url_scheme: str, client_scheme: str, rest: str, *, cluster: bool
) -> int | None:
    """Check the ``host:port/db`` part of a TCP Redis URL; the database the path names, or
    None. redis-py would read a bad path as database 0 and a bad port only at connect time.

    Raises:
        ValueError: a port outside 1..65535, or a path that is not a database number (or
            any path on a cluster URL), naming the URL part.
    """
    if client_scheme == "unix":
        return None  # NOTE: the path is the socket; the database comes from ?db=
    location, _, path = rest.partition("/")
    netloc = location.rpartition("@")[2]
    try:
        port = urlsplit(f"//{netloc}").port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"{url_scheme}:// store URL: the port in {netloc!r} must be an int "
                         f"from 1 to 65535; e.g. {url_scheme}://127.0.0.1:6379")
    if not path:
        return None
    if cluster:
        raise ValueError(f"{url_scheme}:// store URL: path /{path} is not allowed: a Redis "
                         f"Cluster has database 0 only; write {url_scheme}://{netloc}")
    if not path.isdigit() or not path.isascii():
        raise ValueError(f"{url_scheme}:// store URL: path /{path} is not a database number; "
                         f"write {url_scheme}://{netloc}/0 (an int >= 0) or leave the path out")
    return int(path)


def make_retry(retries: int) -> Retry:
    """``retries`` retries after exponential backoff with full jitter (50 ms base, 0.5 s cap)."""
    return Retry(ExponentialWithJitterBackoff(cap=BACKOFF_CAP_S, base=BACKOFF_BASE_S), retries)


def public_location(client_url: str) -> str:
    """The URL without query and credentials, for messages and stats."""
    scheme, _, rest = client_url.split("?")[0].partition("://")
    return f"{scheme}://{rest.rpartition('@')[2]}"


def _glob_escape(prefix: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in prefix)


class RedisStore(Store):
    """Pages as Redis string values; every batch is one round trip.

    Args:
        client: a redis-py client returning bytes (``decode_responses=False``).
        ttl_s: expire pages this many seconds after their last write (None: never).
        where: a human-readable location for error messages.
        read_only: refuse writes (``put`` stores nothing, ``delete`` raises).

    Raises (every method): ``StoreError`` from whatever the client raised (connection and
    timeout errors, server errors, and anything else redis-py lets through); the pool
    reconnects on the next call.
    """

    def __init__(
        self, client: Any, ttl_s: int | None = None, where: str = "redis", *,
        read_only: bool = False,
    ):
        self.client = client
        self.ttl_s = ttl_s
        self.where = where
        self.read_only = read_only
        self._lock = threading.Lock()
        self._counts = {"hits": 0, "misses": 0, "puts": 0, "put_failures": 0}
        self._last_reply: bytes | None = None  # see get_into

    @classmethod
    def from_url(cls, url: str, *, read_only: bool = False) -> RedisStore:
        """``redis://[:password@]host:port/db?ttl=S&retries=1&auth=env:NAME`` and the client
        options of docs/stores.md (timeouts, keepalive, TLS for ``rediss://``); any other
        parameter is a ValueError."""
        client_url, kwargs, options = client_url_and_options(url)
        kwargs = {"socket_timeout": DEFAULT_SOCKET_TIMEOUT_S,
                  "socket_connect_timeout": DEFAULT_CONNECT_TIMEOUT_S, **kwargs}
        client = redis.Redis.from_url(client_url, retry=make_retry(options["retries"]), **kwargs)
        store = cls(client, options["ttl"], where=public_location(client_url),
                    read_only=read_only)
        store._page_secret = options["auth"]
        return store

    @contextmanager
    def _guard(self, op: str) -> Iterator[None]:
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - any client failure is a store failure
            # NOTE: not only RedisError: redis-py also raises TypeError/ValueError/OSError
            # (bad options, closed sockets) and those must not reach the engine either.
            raise StoreError(f"{op} on {self.where} failed: {type(exc).__name__}: "
                             f"{exc}") from exc

    def exists(self, keys: Sequence[str]) -> list[bool]:
        if not keys:
            return []
        with self._guard("exists"):
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.exists(key)
            found = _one_per_key(pipe.execute(), keys, "exists")
            return [bool(hit) for hit in found]

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        with self._guard("get"):
            values = _one_per_key(self._mget(keys), keys, "get")
            if any(value is not None and type(value) is not bytes for value in values):
                raise TypeError("the server returned non-bytes values")
        hits = sum(value is not None for value in values)
        self._count(hits=hits, misses=len(values) - hits)
        return values

    def get_into(self, keys: Sequence[str], buffers: Sequence[memoryview]) -> list[int | None]:
        if len(keys) != len(buffers):
            raise ValueError(f"get_into: {len(keys)} keys but {len(buffers)} buffers; pass one "
                             "buffer per key")
        values = self.get(keys)
        sizes = [copy_into(buf, value) for buf, value in zip(buffers, values, strict=True)]
        # NOTE: keep the batch's last reply (one page) until the next read. Freeing every
        # reply lets glibc hand the heap top back to the kernel, and the next batch then
        # faults all its pages in again: loads measured 0.60-0.73 of a raw pipelined GET loop
        # (whose loop variable happens to keep one reply alive) for this reason alone.
        self._last_reply = values[-1] if values else None
        return sizes

    def put(self, items: Mapping[str, Any]) -> list[bool]:
        if not items:
            return []
        if self.read_only:
            self._count(puts=len(items), put_failures=len(items))
            return [False] * len(items)
        with self._guard("put"):
            pipe = self.client.pipeline(transaction=False)
            for key, value in items.items():
                # NOTE: memoryviews (pages in the linker's staging) go out as they are: the
                # pure-Python packer sends them without a copy; redis-py needs byte views.
                if type(value) is not bytes:
                    value = memoryview(value).cast("B")
                pipe.set(key, value, ex=self.ttl_s)
            # NOTE: a per-command error (OOM under maxmemory-policy noeviction) is one False.
            results = _one_per_key(pipe.execute(raise_on_error=False), items, "put")
        out = [result is True for result in results]
        self._count(puts=len(out), put_failures=out.count(False))
        return out

    def delete(self, keys: Sequence[str]) -> int:
        if not keys:
            return 0
        if self.read_only:
            raise StoreError(f"the store at {self.where} was opened read-only")
        with self._guard("delete"):
            return int(self.client.delete(*keys))

    def stats(self) -> dict[str, Any]:
        with self._guard("stats"):
            infos = [node.info("memory") for node in self.nodes()]
            pages = sum(int(node.dbsize()) for node in self.nodes())
        with self._lock:
            counts = dict(self._counts)
        return {
            "where": self.where,
            "pages": pages,
            "bytes": sum(int(info["used_memory"]) for info in infos),
            "capacity_bytes": sum(int(info.get("maxmemory", 0)) for info in infos),
            "maxmemory_policy": sorted({str(info.get("maxmemory_policy")) for info in infos}),
            "sealed": self.page_secret is not None,
            **counts,
        }

    def scan(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        batch: list[bytes] = []
        with self._guard("scan"):
            for key in self.client.scan_iter(match=_glob_escape(prefix) + "*", count=_SCAN_BATCH):
                batch.append(key)
                if len(batch) >= _SCAN_BATCH:
                    yield from self._sizes(batch)
                    batch = []
            yield from self._sizes(batch)

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:  # noqa: BLE001 - closing a broken connection must not raise
            pass

    def _mget(self, keys: Sequence[str]) -> list[Any]:
        values: list[Any] = self.client.mget(keys)
        return values

    def nodes(self) -> list[Any]:
        """One redis-py client per server (per primary for a cluster), for stats and tests."""
        return [self.client]

    def _sizes(self, keys: list[bytes]) -> Iterator[tuple[str, int]]:
        if not keys:
            return
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.strlen(key)
        for key, size in zip(keys, pipe.execute(), strict=True):
            # NOTE: foreign keys may be any bytes; surrogateescape keeps them listable (never
            # a radixlink key: those are ASCII) instead of failing the whole scan
            yield key.decode("utf-8", "surrogateescape"), int(size)

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] += delta


def _one_per_key(results: Any, keys: Sized, op: str) -> list[Any]:
    """``results`` as a list, checked to hold one answer per key (a protocol mix-up is a store
    failure, never a shifted answer)."""
    out = list(results)
    if len(out) != len(keys):
        raise ValueError(f"{op}: {len(out)} results for {len(keys)} keys")
    return out
