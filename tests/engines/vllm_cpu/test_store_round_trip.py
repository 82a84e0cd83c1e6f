"""Real vLLM on CPU (SmolLM2-135M, fp32): a node saves to a shared store, a fresh node loads
from it, a damaged store is healed in one pass, a Redis store round-trips, and chunked prefill
with preemption keeps working over a store. Every output is token-identical to the baseline
(an engine without the connector and without a prefix cache, conftest), and vLLM's own
counters show where prompt tokens came from. Every engine is a fresh process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import tokenizer_of
from .kit import (
    COMPUTED,
    EXTERNAL,
    PREEMPTIONS,
    PROMPT_SETS,
    counter,
    damage,
    prompt_set,
    whole_pages,
)

BLOCK = 128  # NOTE: vLLM CPU's default block size: the connector's page
SHARED_PAGES = 7  # the 1,000-token shared prefix covers 7 whole pages of 128


def _outputs(reply: dict[str, Any]) -> list[list[int]]:
    return [r["output_ids"] for r in reply["results"]]


def _one_by_one(node: Any, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    return [_outputs(node.generate([p], new_tokens))[0] for p in prompts]


@pytest.fixture(scope="module")
def prompts(smollm2: str) -> list[list[int]]:
    return prompt_set(tokenizer_of(smollm2), "shared")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"file://{tmp_path_factory.mktemp('store')}/pages"


def _spec(model: str, store: str, *, connector: dict[str, Any] | None = None,
          **kwargs: Any) -> Any:
    """A node on ``store``; ``connector``: extra connector options; ``kwargs``: NodeSpec's."""
    from radixlink.integrations.vllm.nodes import NodeSpec, connector_config

    return NodeSpec(model=model, kv_transfer_config=connector_config(store, **(connector or {})),
                    **kwargs)


@pytest.fixture(scope="module")
def saver(smollm2: str, store: str, prompts: list[list[int]], start_node: Any) -> dict[str, Any]:
    node = start_node(_spec(smollm2, store), "saver")
    batch = node.generate(prompts, 16)
    metrics = node.metrics()
    node.close()  # NOTE: close flushes the saves still in flight
    return {"batch": batch, "metrics": metrics}


def test_a_node_on_an_empty_store_matches_the_baseline_and_loads_nothing(
        saver: dict[str, Any], baseline: dict[str, Any]) -> None:  # fmt: skip
    assert _outputs(saver["batch"]) == baseline["shared"]
    assert counter(saver["metrics"], EXTERNAL) == 0


def test_a_fresh_node_loads_the_shared_prefix_from_the_store(
        smollm2: str, store: str, prompts: list[list[int]], start_node: Any,
        baseline: dict[str, Any], saver: dict[str, Any]) -> None:  # fmt: skip
    node = start_node(_spec(smollm2, store), "loader")
    # one batch: six requests miss the device cache at once and load from the store
    assert _outputs(node.generate(prompts, 16)) == baseline["shared"]
    metrics = node.metrics()
    assert counter(metrics, EXTERNAL) >= whole_pages(prompts[:1], BLOCK) * BLOCK
    assert node.reset_prefix_cache()
    # one at a time: the first loads every whole page, later ones only the pages past the
    # shared prefix (vLLM's device cache holds it by then)
    assert _one_by_one(node, prompts, 16) == baseline["shared-singles"]
    after = node.metrics()
    assert counter(after, EXTERNAL) - counter(metrics, EXTERNAL) == \
        (whole_pages(prompts, BLOCK) - (len(prompts) - 1) * SHARED_PAGES) * BLOCK
    node.close()


def test_a_damaged_store_is_healed_in_one_pass(
        smollm2: str, store: str, prompts: list[list[int]], start_node: Any,
        baseline: dict[str, Any], saver: dict[str, Any]) -> None:  # fmt: skip
    """Four pages damaged four ways: outputs stay identical; after one pass that fails to
    load them (and recomputes and saves them), the next reader loads every page."""
    damaged = damage(store, 4)
    assert sorted(damaged.values()) == ["deleted", "flipped", "swapped", "truncated"]
    node = start_node(_spec(smollm2, store), "damaged")
    assert _one_by_one(node, prompts, 16) == baseline["shared-singles"]
    assert node.reset_prefix_cache()
    before = node.metrics()
    assert _one_by_one(node, prompts, 16) == baseline["shared-singles"]
    after = node.metrics()
    loaded = (whole_pages(prompts, BLOCK) - (len(prompts) - 1) * SHARED_PAGES) * BLOCK
    assert counter(after, EXTERNAL) - counter(before, EXTERNAL) == loaded
    assert counter(after, COMPUTED) - counter(before, COMPUTED) == \
        sum(len(p) for p in prompts) - whole_pages(prompts, BLOCK) * BLOCK


def test_a_redis_store_round_trips_with_token_chain_keys(
        smollm2: str, prompts: list[list[int]], start_node: Any, baseline: dict[str, Any],
        redis_url: str) -> None:  # fmt: skip
    node = start_node(_spec(smollm2, redis_url, connector={"keys": "token_chain"}), "redis")
    assert _outputs(node.generate(prompts, 16)) == baseline["shared"]
    assert node.reset_prefix_cache()
    before = node.metrics()
    assert _one_by_one(node, prompts, 16) == baseline["shared-singles"]
    assert counter(node.metrics(), EXTERNAL) - counter(before, EXTERNAL) == \
        (whole_pages(prompts, BLOCK) - (len(prompts) - 1) * SHARED_PAGES) * BLOCK


def test_chunked_prefill_and_preemption_over_a_store(
        smollm2: str, tmp_path: Path, start_node: Any, baseline: dict[str, Any]) -> None:
    """Prompts of 10 blocks in a KV cache of 14: vLLM prefills in chunks of 256 tokens and
    preempts a running request when decoding needs a block; the connector saves chunk by
    chunk, and after the device cache is emptied the same batch loads from the store."""
    prompts = prompt_set(tokenizer_of(smollm2), "sched")
    new_tokens = PROMPT_SETS["sched"][1]
    node = start_node(_spec(smollm2, f"file://{tmp_path}/pages", max_num_batched_tokens=256,
                            max_model_len=1536, num_gpu_blocks_override=14), "sched")
    assert _outputs(node.generate(prompts, new_tokens)) == baseline["sched"]
    assert counter(node.metrics(), PREEMPTIONS) > 0
    assert node.reset_prefix_cache()
    before = node.metrics()
    assert _outputs(node.generate(prompts, new_tokens)) == baseline["sched"]
    assert counter(node.metrics(), EXTERNAL) > counter(before, EXTERNAL)


def test_the_suite_ran_on_real_weights(smollm2: str) -> None:
    config = (Path(smollm2) / "config.json").read_text()
    assert "LlamaForCausalLM" in config
    assert (Path(smollm2) / "model.safetensors").stat().st_size > 100 << 20
