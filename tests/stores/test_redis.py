"""The conformance suite against a real ``redis-server`` (capacity = maxmemory + allkeys-lru)."""

from collections.abc import Iterator

import pytest

from radixlink.stores import open_store

from .conformance import Backend, BackendContract, closing
from .redis_limits import limit_memory


@pytest.mark.redis
class TestRedisStore(BackendContract):
    @pytest.fixture
    def backend(self, redis_url: str) -> Iterator[Backend]:
        def make(cap: int | None) -> object:
            store = open_store(redis_url)
            return limit_memory(store, cap) if cap else store

        yield from closing(Backend(make, persistent=True, exact_lru=False))
