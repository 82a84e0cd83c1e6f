"""Redis stores under real failures (a server SIGKILLed during a batch get and restarted on the
same port; nothing listening; a cluster whose startup node is gone) and their URL forms."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from redis.exceptions import RedisError
from redis_server import RedisServer, free_port

from radixlink.errors import StoreError
from radixlink.stores import open_store

from .conformance import key

pytestmark = pytest.mark.redis


def test_server_killed_during_batch_get_then_restarted(
    redis_url: str, redis_server: RedisServer
) -> None:
    """Flow: a thread loops over 16 MiB batch gets; the server is SIGKILLed under it -> the
    get raises StoreError from the redis-py error (within seconds, no long retry); the server
    restarts on the same port -> the same store object works again on its next call."""
    store = open_store(redis_url)
    keys = [key(i) for i in range(64)]
    assert store.put({k: bytes([i]) * (1 << 18) for i, k in enumerate(keys)}) == [True] * 64
    num_gets, failure = [0], []

    def reader() -> None:
        try:
            while True:
                assert store.get(keys)[0] == bytes([0]) * (1 << 18)
                num_gets[0] += 1
        except StoreError as exc:
            failure.append((exc, time.monotonic()))

    thread = threading.Thread(target=reader)
    thread.start()
    while num_gets[0] < 2:
        time.sleep(0.001)
    killed_at = time.monotonic()
    redis_server.kill()
    thread.join(timeout=30)
    assert not thread.is_alive() and failure, "the get did not fail after the kill"
    exc, failed_at = failure[0]
    assert isinstance(exc.__cause__, RedisError) and failed_at - killed_at < 5
    with pytest.raises(StoreError):
        store.exists(keys[:1])  # still down: fails fast, does not hang
    redis_server.start()
    assert store.get(keys[:2]) == [None, None]  # no persistence: the restarted server is empty
    assert store.put({keys[0]: b"back"}) == [True] and store.get(keys[:1]) == [b"back"]
    store.close()


def test_nothing_listening_is_a_store_error() -> None:
    """Every operation against a port with no server raises StoreError, quickly."""
    store = open_store(f"redis://127.0.0.1:{free_port()}/0")
    started = time.monotonic()
    for call in (
        lambda: store.exists(["k"]),
        lambda: store.get(["k"]),
        lambda: store.put({"k": b""}),
    ):
        with pytest.raises(StoreError):
            call()
    assert time.monotonic() - started < 5
    store.close()


def test_cluster_unreachable_at_open_is_a_store_error() -> None:
    """Opening a cluster URL whose startup node is down raises StoreError (the client connects
    at open to learn the slot map)."""
    with pytest.raises(StoreError):
        open_store(f"redis+cluster://127.0.0.1:{free_port()}")


def test_ttl_expires_pages(redis_url: str) -> None:
    """With ?ttl=N every put sets an expiry of N seconds."""
    store = open_store(redis_url + "?ttl=100")
    store.put({key(1): b"page"})
    assert 0 < store.nodes()[0].ttl(key(1)) <= 100
    store.close()


def test_unix_socket_url(tmp_path: Path) -> None:
    """unix:///path.sock reaches a server listening on a unix socket."""
    sock = tmp_path / "redis.sock"
    server = RedisServer(tmp_path, extra=("--unixsocket", str(sock))).start()
    try:
        store = open_store(f"unix://{sock}?db=0")
        assert store.put({key(1): b"p"}) == [True] and store.get([key(1)]) == [b"p"]
        store.close()
    finally:
        server.stop()


def test_credentials_never_appear_in_errors(tmp_path: Path) -> None:
    """A rejected password surfaces as StoreError whose message does not contain it."""
    server = RedisServer(tmp_path, extra=("--requirepass", "right-pw")).start()
    try:
        store = open_store(f"redis://:s3cret-pw@127.0.0.1:{server.port}/0")
        with pytest.raises(StoreError) as info:
            store.exists(["k"])
        assert "s3cret-pw" not in str(info.value) and "s3cret-pw" not in store.where
        store.close()
        good = open_store(f"redis://:right-pw@127.0.0.1:{server.port}/0")
        assert good.exists(["k"]) == [False]
        good.close()
    finally:
        server.stop()
