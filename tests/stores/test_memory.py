"""The conformance suite against ``memory://``."""

from collections.abc import Iterator

import pytest

from radixlink.stores import open_store

from .conformance import Backend, BackendContract, closing


class TestMemoryStore(BackendContract):
    @pytest.fixture
    def backend(self) -> Iterator[Backend]:
        yield from closing(
            Backend(
                lambda cap: open_store(f"memory://?capacity={cap or 1 << 26}"), persistent=False
            )
        )
