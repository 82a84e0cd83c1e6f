"""Helpers of the real-vLLM suite: prompts with a long shared prefix, vLLM's own counters, and
damage done to a store's pages through the store's own primitives (no mocks: a real directory
or a real redis-server holds the bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pydoc_data.topics import topics

from radixlink.stores import open_store

EXTERNAL = "vllm:prompt_tokens_by_source{source=external_kv_transfer}"
COMPUTED = "vllm:prompt_tokens_by_source{source=local_compute}"
PREEMPTIONS = "vllm:num_preemptions"


def _text_ids(tokenizer: object, names: list[str], num_tokens: int) -> list[int]:
    text = ""
    ids: list[int] = []
    for name in names:
        text += topics[name].strip() + "\n\n"
        ids = tokenizer.encode(text).ids  # type: ignore[attr-defined]
        if len(ids) >= num_tokens:
            return ids[:num_tokens]
    raise AssertionError(f"not enough text for {num_tokens} tokens")


@dataclass(frozen=True, slots=True)
class PromptSet:
    """``num`` prompts of ``total_len`` tokens sharing their first ``prefix_len`` tokens."""

    prompts: list[list[int]]
    prefix_len: int

    @property
    def num_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


def shared_prefix_prompts(tokenizer: object, *, num: int = 6, prefix_len: int = 1000,
                          total_len: int = 1180, seed: int = 0) -> PromptSet:  # fmt: skip
    """Real text: a reference document as the shared prefix, then a different excerpt and a
    question per prompt (the same arguments give the same token ids)."""
    names = sorted(topics)
    prefix = _text_ids(tokenizer, names[seed::7], prefix_len)
    prompts = []
    for i in range(num):
        tail = _text_ids(tokenizer, names[seed + 3 * i + 1::11], total_len - prefix_len)
        prompts.append(prefix + tail)
    return PromptSet(prompts=prompts, prefix_len=prefix_len)


def counter(metrics: dict[str, float], name: str) -> float:
    return float(metrics.get(name, 0.0))


def whole_pages(prompts: list[list[int]], block_size: int) -> int:
    """Pages vLLM can take from a store: whole blocks, keeping one prompt token to compute."""
    return sum((len(p) - 1) // block_size for p in prompts)


def damage(url: str, num: int) -> dict[str, str]:
    """Damage ``num`` page keys spread over the store, each a different way (flipped byte,
    deleted, swapped with another page, truncated); returns key -> how."""
    kinds = ("flipped", "deleted", "swapped", "truncated")
    with open_store(url) as store:
        keys = sorted(key for key, _ in store.scan())
        assert len(keys) > 2 * num, f"only {len(keys)} pages stored"
        step = len(keys) // (num + 1)
        picked = [keys[step * (i + 1)] for i in range(num)]
        done: dict[str, str] = {}
        for i, key in enumerate(picked):
            kind = kinds[i % len(kinds)]
            blob = store.get([key])[0]
            assert blob is not None
            if kind == "flipped":
                data = bytearray(blob)
                data[len(data) // 2] ^= 0xFF
                store.put({key: bytes(data)})
            elif kind == "deleted":
                store.delete([key])
            elif kind == "swapped":
                other = keys[(keys.index(key) + 1) % len(keys)]
                store.put({key: store.get([other])[0]})
            else:
                store.put({key: blob[: len(blob) // 2]})
            done[key] = kind
        return done


# The prompt sets of the suite, by name: (builder kwargs, new tokens, batched). The baseline
# (conftest) computes each set's reference outputs once, the way the tests run it: one batch,
# or one request at a time.
PROMPT_SETS: dict[str, tuple[dict[str, int], int, bool]] = {
    "shared": ({}, 16, True),
    "shared-singles": ({}, 16, False),
    "sched": ({"num": 4, "total_len": 1270}, 24, True),
    "servers": ({"num": 3, "seed": 2}, 16, False),
}


def prompt_set(tokenizer: object, name: str) -> list[list[int]]:
    return shared_prefix_prompts(tokenizer, **PROMPT_SETS[name][0]).prompts
