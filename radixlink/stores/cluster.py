"""``redis+cluster://host:port?ttl=SECONDS``: Redis Cluster through redis-py's cluster client.

Owns only what differs from the single-server store: the client, per-slot batching and the
per-primary stats. Same semantics as ``RedisStore``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError
from redis.retry import Retry

from radixlink.errors import StoreError
from radixlink.stores.redis import (
    CLIENT_DEFAULTS,
    RedisStore,
    client_url_and_options,
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
    def from_url(cls, url: str) -> ClusterStore:
        """``redis+cluster://host:port`` (or ``rediss+cluster://`` for TLS)."""
        scheme = url.split("://", 1)[0].lower()
        client_url, options = client_url_and_options(url, scheme.replace("+cluster", ""))
        retry = Retry(NoBackoff(), options["retries"])
        try:  # NOTE: unlike redis.Redis, the cluster client connects here to learn the slots
            client = RedisCluster.from_url(client_url, retry=retry, **CLIENT_DEFAULTS)
        except (RedisError, RedisClusterException) as exc:
            where = public_location(client_url)
            raise StoreError(f"cannot reach Redis Cluster at {where}: {exc}") from exc
        return cls(client, options["ttl_s"], where=public_location(client_url) + " (cluster)")

    def _mget(self, keys: Sequence[str]) -> list[bytes | None]:
        values: list[bytes | None] = self.client.mget_nonatomic(keys)
        return values

    def nodes(self) -> list[Any]:
        return [self.client.get_redis_connection(node) for node in self.client.get_primaries()]
