"""Fixtures for the SGLang integration tests: import stand-ins, store URLs of each kind.

The tests need ``sglang`` (installed by scripts/setup_sglang_venv.sh into .venv-sglang); every
test module skips with ``SGLANG_MISSING`` where it is missing, so the main venv's run skips
them. SGLang's cache modules reach ``torchvision`` at import time (multimodal configs), whose
PyPI build does not load beside torch 2.13.0+cpu: a stand-in module is registered for it here,
and only here (the library never imports one). No code path under test calls into it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import quote

import pytest

SGLANG_MISSING = (
    "sglang is not importable: run scripts/setup_sglang_venv.sh and "
    ".venv-sglang/bin/python -m pytest tests/engines/sglang"
)
STAND_INS = ("torchvision",)


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves a MagicMock module for each name in ``STAND_INS`` (and its submodules)."""

    def find_spec(self, fullname: str, path: object, target: object = None) -> object:
        if any(fullname == name or fullname.startswith(name + ".") for name in STAND_INS):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> object:
        module = mock.MagicMock(name=spec.name)
        module.__path__ = []
        module.__spec__ = spec
        return module

    def exec_module(self, module: object) -> None:
        pass


def _install_stand_ins() -> None:
    venv = Path(sys.prefix)
    # NOTE: SGLang's page hash is a torch C++ extension built on first use; the setup script
    # builds it into the venv, so tests reuse it instead of compiling (~10 s) per machine.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(venv / "torch-extensions"))
    os.environ.setdefault("SGLANG_RUST_BUILD_MODE", "never")  # the bundled tree core .so
    if importlib.util.find_spec("transformers") is not None:
        import transformers.utils.import_utils as hf_imports

        # NOTE: transformers caches "no torchvision" only if asked before the stand-in exists.
        hf_imports.is_torchvision_available()
    sys.meta_path.insert(0, _StandInFinder())


if importlib.util.find_spec("sglang") is not None:
    _install_stand_ins()


@pytest.fixture
def nodes() -> Iterator[Callable[..., Any]]:
    """``nodes(shape, store_url, seed)``: SGLang nodes (tests/engines/sglang/harness.py),
    closed at teardown."""
    from .harness import Node  # NOTE: imports SGLang; only tests that run import this

    made: list[Any] = []

    def make(shape: Any, url: str, seed: int) -> Any:
        node = Node(shape, url, seed=seed)
        made.append(node)
        return node

    yield make
    for node in made:
        node.close()


@pytest.fixture
def file_url(tmp_path: Path) -> str:
    return f"file://{tmp_path}/store"


def faults_url(inner: str, **params: object) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"faults://?inner={quote(inner, safe='')}&{query}"


@pytest.fixture(params=["file", "redis", "faults"])
def store_url(request: pytest.FixtureRequest, file_url: str) -> str:
    """One shared store per test: a directory, a real redis-server, or faults:// (1 ms of
    latency on every call) around a directory."""
    if request.param == "redis":
        return str(request.getfixturevalue("redis_url"))
    if request.param == "faults":
        return faults_url(file_url, delay_ms=1)
    return file_url
