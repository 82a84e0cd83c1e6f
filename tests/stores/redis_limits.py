"""Give a Redis store a byte capacity the Redis way: maxmemory + allkeys-lru on every primary."""

from __future__ import annotations

from radixlink.stores.redis import RedisStore


def limit_memory(store: RedisStore, capacity_bytes: int) -> RedisStore:
    """Set each primary's maxmemory to its current use plus its share of ``capacity_bytes``.

    The conftest fixtures reset maxmemory after each test.
    """
    nodes = store.nodes()
    for node in nodes:
        used = int(node.info("memory")["used_memory"])
        node.config_set("maxmemory", used + capacity_bytes // len(nodes))
        node.config_set("maxmemory-policy", "allkeys-lru")
    return store
