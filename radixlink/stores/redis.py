"""``redis://[:password@]host:port/db?ttl=SECONDS`` (also ``rediss://``, ``unix://``).

Owns the single-server Redis/Valkey backend: pipelined batches over redis-py (hiredis is used
automatically when installed). Capacity is Redis's own ``maxmemory`` + ``allkeys-lru``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlencode

import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError
from redis.retry import Retry

from radixlink.errors import StoreError
from radixlink.stores.base import Store
from radixlink.stores.registry import split_url

# NOTE: redis-py's default retries 10 times with backoff; a linker wants a dead server to fail
# fast (the load is aborted and recomputed). One immediate retry still heals a stale pooled
# connection after a server restart.
DEFAULT_RETRIES = 1
CLIENT_DEFAULTS: dict[str, Any] = {"socket_connect_timeout": 2.0, "socket_timeout": 10.0}
_SCAN_BATCH = 1000


def client_url_and_options(url: str, scheme: str | None = None) -> tuple[str, dict[str, Any]]:
    """Split our parameters (``ttl``, ``retries``) off ``url``; the rest (TLS, timeouts, ...)
    passes through to redis-py's ``from_url``. Returns (client URL, store options)."""
    url_scheme, rest, params = split_url(url)
    ttl = params.pop("ttl", None)
    retries = params.pop("retries", None)
    options: dict[str, Any] = {
        "ttl_s": int(ttl) if ttl else None,
        "retries": int(retries) if retries is not None else DEFAULT_RETRIES,
    }
    if options["ttl_s"] is not None and options["ttl_s"] <= 0:
        raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r} in {url!r}")
    query = f"?{urlencode(params)}" if params else ""
    return f"{scheme or url_scheme}://{rest}{query}", options


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

    Raises (every method): ``StoreError`` from the redis-py exception when the server is
    unreachable or fails; the pool reconnects on the next call.
    """

    def __init__(self, client: Any, ttl_s: int | None = None, where: str = "redis"):
        self.client = client
        self.ttl_s = ttl_s
        self.where = where
        self._lock = threading.Lock()
        self._counts = {"hits": 0, "misses": 0, "puts": 0, "put_failures": 0}

    @classmethod
    def from_url(cls, url: str) -> RedisStore:
        """``redis://[:password@]host:port/db?ttl=SECONDS&retries=1`` plus any redis-py URL
        option (``socket_timeout``, ``ssl_cert_reqs`` for ``rediss://``, ...)."""
        client_url, options = client_url_and_options(url)
        retry = Retry(NoBackoff(), options["retries"])
        client = redis.Redis.from_url(client_url, retry=retry, **CLIENT_DEFAULTS)
        return cls(client, options["ttl_s"], where=public_location(client_url))

    @contextmanager
    def _guard(self, op: str) -> Iterator[None]:
        try:
            yield
        except (RedisError, RedisClusterException) as exc:
            raise StoreError(f"{op} on {self.where} failed: {exc}") from exc

    def exists(self, keys: Sequence[str]) -> list[bool]:
        if not keys:
            return []
        with self._guard("exists"):
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.exists(key)
            return [bool(found) for found in pipe.execute()]

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        with self._guard("get"):
            values: list[bytes | None] = self._mget(keys)
        hits = sum(value is not None for value in values)
        self._count(hits=hits, misses=len(values) - hits)
        return values

    def put(self, items: Mapping[str, bytes]) -> list[bool]:
        if not items:
            return []
        with self._guard("put"):
            pipe = self.client.pipeline(transaction=False)
            for key, value in items.items():
                pipe.set(key, value, ex=self.ttl_s)
            # NOTE: a per-command error (OOM under maxmemory-policy noeviction) is one False.
            results = pipe.execute(raise_on_error=False)
        out = [result is True for result in results]
        self._count(puts=len(out), put_failures=out.count(False))
        return out

    def delete(self, keys: Sequence[str]) -> int:
        if not keys:
            return 0
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
        self.client.close()

    def _mget(self, keys: Sequence[str]) -> list[bytes | None]:
        values: list[bytes | None] = self.client.mget(keys)
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
            yield key.decode(), int(size)

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] += delta
