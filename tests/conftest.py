"""Shared fixtures: a real redis-server and a 3-primary Redis Cluster on free loopback ports.

Session-scoped servers (started once, stopped by PID); function-scoped URL fixtures flush them
and reset ``maxmemory`` so every test starts empty. Tests skip when the binaries are missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from redis_server import (
    MISSING_REASON,
    REDIS_CLI,
    REDIS_SERVER,
    RedisClusterServers,
    RedisServer,
    start_cluster,
)


def _require_redis() -> None:
    if REDIS_SERVER is None or REDIS_CLI is None:
        pytest.skip(MISSING_REASON)
    pytest.importorskip(
        "redis", reason="the redis package is missing: pip install 'radixlink[redis]'"
    )


def _reset(server: RedisServer) -> None:
    import redis

    client = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        client.flushall()
        client.config_set("maxmemory", 0)
        client.config_set("maxmemory-policy", "noeviction")
    finally:
        client.close()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the session (tests that kill it must restart it)."""
    _require_redis()
    server = RedisServer(Path(tmp_path_factory.mktemp("redis"))).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The session server's URL, flushed and with no memory limit, restarted if a test killed it."""
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()
    _reset(redis_server)
    yield redis_server.url
    if redis_server.proc is not None and redis_server.proc.poll() is None:
        _reset(redis_server)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """Three cluster-enabled primaries joined into one cluster, for the session."""
    _require_redis()
    cluster = start_cluster(Path(tmp_path_factory.mktemp("redis-cluster")))
    yield cluster
    cluster.stop()


@pytest.fixture
def redis_cluster_url(redis_cluster: RedisClusterServers) -> Iterator[str]:
    """The cluster's URL (``redis+cluster://``), every primary flushed and unlimited."""
    for server in redis_cluster.servers:
        _reset(server)
    yield redis_cluster.url
    for server in redis_cluster.servers:
        _reset(server)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """torch on one thread for a module: model tests compare timings and outputs run by run,
    and two cores are shared with the store servers."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
