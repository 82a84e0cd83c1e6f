"""Helpers of the real-vLLM suite: prompts with a long shared prefix, vLLM's own counters, and
damage done to a store's pages through the store's own primitives (no mocks: a real directory
or a real redis-server holds the bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pydoc_data.topics import topics

from radixlink.stores import open_store
from radixlink.stores.codec import key_digest

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


def forge_swaps(url: str, num_pairs: int) -> list[tuple[str, str]]:
    """Swap the payloads of ``num_pairs`` pairs of pages and rewrite each header's key digest
    to its new key, so every check passes (the pages are whole, checksummed and name the key
    they sit under) but the KV is another page's: what a connector defect that landed the
    wrong page would load. Returns the swapped pairs."""
    with open_store(url) as store:
        keys = sorted(key for key, _ in store.scan())
        assert len(keys) >= 2 * num_pairs, f"only {len(keys)} pages stored"
        step = len(keys) // (2 * num_pairs)
        picked = [keys[step * i] for i in range(2 * num_pairs)]
        pairs = list(zip(picked[0::2], picked[1::2], strict=True))
        for a, b in pairs:
            blob_a, blob_b = store.get([a, b])
            assert blob_a is not None and blob_b is not None
            store.put({a: _rekeyed(blob_b, b, a), b: _rekeyed(blob_a, a, b)})
        return pairs


def _rekeyed(blob: bytes, old: str, new: str) -> bytes:
    # NOTE: the key digest sits at bytes 24..40 of the header (stores/codec.py's diagram);
    # the checksum covers the payload only, so the page then verifies under ``new``
    assert blob[24:40] == key_digest(old), "the page header layout changed: update _rekeyed"
    return blob[:24] + key_digest(new) + blob[40:]


@dataclass(frozen=True, slots=True)
class SetSpec:
    """How the suite runs one prompt set: on which model, built how, for how many new tokens,
    as one batch or one request at a time."""

    model: str  # the model fixture's name
    kwargs: dict[str, int]  # shared_prefix_prompts' arguments
    new_tokens: int
    batched: bool


# The prompt sets of the suite, by name. The session baseline of each model (conftest) runs
# every set of that model once, the way the tests run it (one batch, or one request at a
# time: compare like with like), and checks it against HF transformers.
PROMPT_SETS: dict[str, SetSpec] = {
    "shared": SetSpec("smollm2", {}, 16, True),
    "shared-singles": SetSpec("smollm2", {}, 16, False),
    "sched": SetSpec("smollm2", {"num": 4, "total_len": 1270}, 24, True),
    "servers": SetSpec("smollm2", {"num": 3, "seed": 2}, 16, False),
    "gemma": SetSpec("gemma3", {"num": 3}, 16, False),
}


def prompt_set(tokenizer: object, name: str) -> list[list[int]]:
    return shared_prefix_prompts(tokenizer, **PROMPT_SETS[name].kwargs).prompts
