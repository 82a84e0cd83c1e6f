"""The conformance suite against ``file://`` (a fresh directory per test)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from radixlink.stores import open_store

from .conformance import Backend, BackendContract, closing


class TestDirectoryStore(BackendContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[Backend]:
        url = f"file://{tmp_path}/store?capacity="
        yield from closing(
            Backend(lambda cap: open_store(url + str(cap or 1 << 30)), persistent=True)
        )
