"""Redis stores against a real server: whatever the client raises inside a store call is a
``StoreError``, and a paused server (SIGSTOP) costs one bounded call, not 20 s (issue 14,
items 4 and 5, store side)."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis
from redis_server import RedisServer

from radixlink.errors import StoreError
from radixlink.stores import open_store
from radixlink.stores.redis import RedisStore

from .conformance import key

pytestmark = pytest.mark.redis


def test_any_client_exception_becomes_a_store_error(redis_server: RedisServer, redis_url: str
                                                    ) -> None:
    """A client that raises something other than a RedisError (here: a negative socket
    timeout, a ValueError from the socket layer) still fails each store call with StoreError
    raised from it, never the bare exception."""
    client = redis.Redis(host="127.0.0.1", port=redis_server.port, socket_timeout=-1)
    store = RedisStore(client, where="test")
    for call in (lambda: store.exists([key(1)]), lambda: store.get([key(1)]),
                 lambda: store.put({key(1): b"v"}), lambda: store.delete([key(1)])):
        with pytest.raises(StoreError) as info:
            call()
        assert info.value.__cause__ is not None
    store.close()


@pytest.mark.parametrize(
    ("query", "bound_s"),
    [("", 3.5), ("?socket_timeout=0.2&retries=0", 1.0)],
    ids=["defaults", "short-timeout-no-retry"],
)
def test_a_paused_server_costs_one_bounded_call(
    redis_server: RedisServer, redis_url: str, query: str, bound_s: float
) -> None:
    """Flow: the server is SIGSTOPped -> each call (exists, get, put) raises StoreError within
    (1 + retries) x socket_timeout plus backoff (defaults: 2 x 1 s; it used to be 2 x 10 s);
    SIGCONT -> the same store object works again."""
    store = open_store(redis_url + query)
    assert store.put({key(1): b"page"}) == [True]
    assert redis_server.proc is not None
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    try:
        for call in (lambda: store.exists([key(1)]), lambda: store.get([key(1)]),
                     lambda: store.put({key(2): b"p"})):
            started = time.monotonic()
            with pytest.raises(StoreError):
                call()
            assert time.monotonic() - started < bound_s
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    assert store.get([key(1)]) == [b"page"]
    store.close()


def test_options_that_broke_calls_are_refused_at_open(redis_url: str) -> None:
    """The URL options that used to open fine and then raise TypeError/ValueError inside a
    lookup (decode_responses, a negative timeout, TLS options on redis://, infinite retries)
    are ValueErrors at open."""
    for query in ("decode_responses=true", "socket_timeout=-1", "ssl_cert_reqs=none",
                  "retries=-1"):
        with pytest.raises(ValueError, match=query.split("=")[0]):
            open_store(f"{redis_url}?{query}")
