"""The suite's reference is sound: each model's cache-off vLLM engine gives HF transformers'
greedy outputs on the same weights, none degenerate (the session check in conftest's
``_baseline``; it failed with the old export, whose every output was token 0), and answers its
known-answer prompt.
"""

from __future__ import annotations

import pytest

from .kit import PROMPT_SETS
from .reference import KNOWN_ANSWERS, degenerate

MODELS = [("smollm2", "baseline"), ("gemma3", "gemma3_baseline")]


@pytest.mark.parametrize(("model", "fixture"), MODELS)
def test_the_cache_off_engine_gives_hf_transformers_outputs(
        model: str, fixture: str, request: pytest.FixtureRequest) -> None:  # fmt: skip
    base = request.getfixturevalue(fixture)
    assert sorted(base.outputs) == sorted(n for n, s in PROMPT_SETS.items() if s.model == model)
    for name, outputs in base.outputs.items():
        assert outputs == base.reference[name], name
        assert not any(degenerate(out) for out in outputs), name
        assert len({tuple(out) for out in outputs}) == len(outputs), f"{name}: repeated answers"


@pytest.mark.parametrize(("model", "fixture"), MODELS)
def test_the_engine_answers_the_known_answer_prompt(
        model: str, fixture: str, request: pytest.FixtureRequest) -> None:  # fmt: skip
    base = request.getfixturevalue(fixture)
    assert base.known_answer.startswith(KNOWN_ANSWERS[model][1]), base.known_answer
