"""``redis+cluster://host:port?ttl=SECONDS``: Redis Cluster through redis-py's cluster client.

Owns only what differs from the single-server store: the client, per-slot batching and the
per-primary stats. Same semantics as ``RedisStore``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.cluster import RedisCluster

from radixlink.errors import StoreError
from radixlink.stores.redis import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_SOCKET_TIMEOUT_S,
    RedisStore,
    client_url_and_options,
    make_retry,
    public_location,
)


class ClusterStore(RedisStore):
    """Pages spread over the cluster's primaries by key slot.

    Batches are grouped per node by redis-py: pipelines (exists, put) are split per node and
    sent concurrently per node; ``get`` uses ``mget_nonatomic``, one MGET per slot group. A
    batch is not atomic across slots; each page still is. Any startup node works in the URL;
    the client discovers the rest.
    """

    @classmethod
    def from_url(cls, url: str, *, read_only: bool = False) -> ClusterStore:
        """``redis+cluster://host:port`` (or ``rediss+cluster://`` for TLS); parameters as for
        ``RedisStore`` except ``db``."""
        scheme = url.split("://", 1)[0].lower()
        client_url, kwargs, options = client_url_and_options(
            url, scheme.replace("+cluster", ""), cluster=True
        )
        kwargs = {"socket_timeout": DEFAULT_SOCKET_TIMEOUT_S,
                  "socket_connect_timeout": DEFAULT_CONNECT_TIMEOUT_S, **kwargs}
        where = public_location(client_url)
        try:  # NOTE: unlike redis.Redis, the cluster client connects here to learn the slots
            client = RedisCluster.from_url(
                client_url, retry=make_retry(options["retries"]), **kwargs
            )
        except Exception as exc:  # noqa: BLE001 - any client failure is a store failure
            raise StoreError(f"cannot reach Redis Cluster at {where}: {type(exc).__name__}: "
                             f"{exc}; check the address and that the cluster is up") from exc
        store = cls(client, options["ttl"], where=where + " (cluster)", read_only=read_only)
        store._page_secret = options["auth"]
        return store

    def _mget(self, keys: Sequence[str]) -> list[Any]:
        values: list[Any] = self.client.mget_nonatomic(keys)
        return values

    def nodes(self) -> list[Any]:
        return [self.client.get_redis_connection(node) for node in self.client.get_primaries()]
