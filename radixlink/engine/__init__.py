"""Reference engine (re-exports only): the hybrid model, its weights and tokenizers."""

from radixlink.engine.model import ForwardInput, HybridLM, ModelSpec, PagedCache
from radixlink.engine.weights import (
    MODEL_NAMES,
    TINY_HYBRID,
    BPETokenizer,
    ByteTokenizer,
    ChatTokenizer,
    chatml,
    load_model,
    random_model,
    smollm2_gguf_path,
)

__all__ = [
    "MODEL_NAMES",
    "TINY_HYBRID",
    "BPETokenizer",
    "ByteTokenizer",
    "ChatTokenizer",
    "ForwardInput",
    "HybridLM",
    "ModelSpec",
    "PagedCache",
    "chatml",
    "load_model",
    "random_model",
    "smollm2_gguf_path",
]
