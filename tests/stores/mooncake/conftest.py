"""Fixtures of the Mooncake tests: a real master + segment holder per session (or per test
for the failure cases), and linkers closed at teardown.

These tests only run inside a private network namespace with loopback only: the
``test_mooncake.py`` wrapper one level up starts them there (``unshare -n``). Elsewhere the
files are not collected, so nothing ever listens beyond this machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from faults.conftest import link  # noqa: F401 - the fault matrix's linker fixture
from mooncake_cluster import MooncakeCluster, in_private_netns

from radixlink.stores import Store, open_store

collect_ignore_glob = [] if in_private_netns() else ["test_*.py"]


@pytest.fixture(scope="session")
def session_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MooncakeCluster]:
    """One master and one 32 MiB segment holder for the session."""
    workdir = Path(tmp_path_factory.mktemp("mooncake"))
    cluster = MooncakeCluster(workdir, segment_bytes=32 << 20).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def session_cleaner(session_cluster: MooncakeCluster) -> Iterator[Store]:
    with open_store(session_cluster.url()) as store:
        yield store


@pytest.fixture
def mooncake_url(session_cluster: MooncakeCluster, session_cleaner: Store) -> Iterator[str]:
    """The session cluster's client URL; radixlink's keys are cleared after each test."""
    yield session_cluster.url()
    session_cleaner.clear()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[MooncakeCluster]:
    """A cluster of this test's own, for tests that kill its processes."""
    cluster = MooncakeCluster(tmp_path / "mooncake").start()
    yield cluster
    cluster.stop()
