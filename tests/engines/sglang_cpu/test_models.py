"""SGLang on CPU with caching off equals HF transformers on the same weights, token for token in
fp32, and is not degenerate; the known-answer prompt gives " Paris" in both models. This proves
the engine, the exported weights and the stand-ins (none of which replaces model math) before
any cache is compared against the baseline."""

from __future__ import annotations

from typing import Any

import pytest

from .kit import KNOWN_ANSWERS, degenerate, outputs, tokenizer_of

CASES = [("smollm2", "shared"), ("gemma3", "shared")]


@pytest.mark.parametrize(("fixture", "name"), CASES)
def test_cache_off_outputs_equal_hf_transformers(
        fixture: str, name: str, baseline: dict[tuple[str, str], list[Any]],
        reference: dict[tuple[str, str], list[list[int]]]) -> None:
    """Every greedy output of the cache-off engine is HF's, and none is one repeated token."""
    got = outputs(baseline[(fixture, name)])
    assert got == reference[(fixture, name)]
    assert not any(degenerate(out) for out in got), got
    assert len({tuple(out) for out in got}) > 1  # different prompts, different answers


@pytest.mark.parametrize("fixture", list(KNOWN_ANSWERS))
def test_the_known_answer_prompt_says_paris(
        fixture: str, baseline: dict[tuple[str, str], list[Any]],
        reference: dict[tuple[str, str], list[list[int]]],
        request: pytest.FixtureRequest) -> None:
    """The reference engine's known answer, in SGLang and in HF transformers alike."""
    served = baseline[(fixture, "known")][0]
    assert served.output_ids == reference[(fixture, "known")][0]
    text = tokenizer_of(request.getfixturevalue(fixture)).decode(served.output_ids)
    assert text.startswith(KNOWN_ANSWERS[fixture][1]), text
    assert not served.aborted and served.cached == 0
