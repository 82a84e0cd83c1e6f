"""The conformance suite against ``tiered://`` (memory front over a directory back)."""

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from radixlink.stores import open_store

from .conformance import Backend, BackendContract, closing


class TestTieredStore(BackendContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[Backend]:
        def make(cap: int | None) -> object:
            front = quote(f"memory://?capacity={cap or 1 << 26}", safe="")
            back = quote(f"file://{tmp_path}/back?capacity={cap or 1 << 30}", safe="")
            return open_store(f"tiered://?front={front}&back={back}")

        yield from closing(Backend(make, persistent=True, exact_lru=False))
