"""Fixtures for the vLLM connector tests: a local model directory, store URLs of each kind.

The tests need ``vllm`` (scripts/setup_vllm_venv.sh [VERSION] installs 0.33.0 into .venv-vllm,
0.34.0 into .venv-vllm-034); every test module skips with that reason where it is missing, so
the main venv's run skips them. vLLM's scheduler-side modules import on CPU as they are, so no
stand-in modules are needed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest

VLLM_MISSING = (
    "vllm is not importable: run scripts/setup_vllm_venv.sh and "
    ".venv-vllm/bin/python -m pytest tests/engines/vllm"
)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A directory with only a small config.json (no hub access, no weights)."""
    from .harness import write_model_dir

    return write_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture
def file_url(tmp_path: Path) -> str:
    return f"file://{tmp_path}/store"


@pytest.fixture(params=["file", "redis", "faults"])
def store_url(request: pytest.FixtureRequest, file_url: str) -> str:
    """One shared store per test: a directory, a real redis-server, or faults:// (latency on
    every call) around a directory."""
    if request.param == "redis":
        return str(request.getfixturevalue("redis_url"))
    if request.param == "faults":
        return faults_url(file_url, delay_ms=1)
    return file_url


def faults_url(inner: str, **params: object) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"faults://?inner={quote(inner, safe='')}&{query}"


@pytest.fixture
def nodes() -> Callable[..., object]:
    """A Node factory whose nodes are closed (threads joined, stores closed) after the test."""
    from .harness import Node

    made: list[Node] = []

    def make(*args: object, **kwargs: object) -> Node:
        node = Node(*args, **kwargs)  # type: ignore[arg-type]
        made.append(node)
        return node

    yield make  # type: ignore[misc]
    for node in made:
        node.close()
