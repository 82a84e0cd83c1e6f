"""Real vLLM on CPU (SmolLM2-135M, fp32): a node saves to a shared store, a fresh node loads
from it, a damaged store is healed in one pass, wrong KV that passes every check changes the
outputs (so the identity checks can fail), a Redis store round-trips, and chunked prefill with
preemption keeps working over a store. Every output is token-identical to the baseline (an
engine without the connector and without a prefix cache, checked against HF transformers;
conftest), and vLLM's own counters show where prompt tokens came from.

Processes: one saver, then one loader shared by the load, heal and wrong-KV tests (each
empties the loader's device prefix cache first); the Redis and the scheduling tests start one
each.
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
    forge_swaps,
    prompt_set,
    whole_pages,
)

BLOCK = 128  # NOTE: vLLM CPU's default block size: the connector's page
SHARED_PAGES = 7  # the 1,000-token shared prefix covers 7 whole pages of 128


def _outputs(reply: dict[str, Any]) -> list[list[int]]:
    return [r["output_ids"] for r in reply["results"]]


def _one_by_one(node: Any, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    return [_outputs(node.generate([p], new_tokens))[0] for p in prompts]


def _singles_loaded(prompts: list[list[int]]) -> int:
    """Store tokens of one-by-one requests after the device cache was emptied."""
    return (whole_pages(prompts, BLOCK) - (len(prompts) - 1) * SHARED_PAGES) * BLOCK


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
def nodes(smollm2: str, store: str, start_node: Any) -> list[Any]:
    """The saver and the loader on one store, started side by side: the loader reads nothing
    before the saver has closed."""
    return start_node.many([(_spec(smollm2, store), "saver"), (_spec(smollm2, store), "loader")])


@pytest.fixture(scope="module")
def saver(nodes: list[Any], prompts: list[list[int]]) -> dict[str, Any]:
    node = nodes[0]
    batch = node.generate(prompts, 16)
    metrics = node.metrics()
    node.close()  # NOTE: close flushes the saves still in flight
    return {"batch": batch, "metrics": metrics}


@pytest.fixture(scope="module")
def loader(nodes: list[Any], saver: dict[str, Any]) -> Any:
    """A process that has not served yet when the saver closes, shared by the tests below:
    each empties its device prefix cache before it reads, so what it counts comes from the
    store."""
    return nodes[1]


def test_a_node_on_an_empty_store_matches_the_baseline_and_loads_nothing(
        saver: dict[str, Any], baseline: Any) -> None:  # fmt: skip
    assert _outputs(saver["batch"]) == baseline.outputs["shared"]
    assert counter(saver["metrics"], EXTERNAL) == 0


def test_a_fresh_node_loads_the_shared_prefix_from_the_store(
        loader: Any, prompts: list[list[int]], baseline: Any) -> None:  # fmt: skip
    assert loader.reset_prefix_cache()
    before = loader.metrics()
    # one batch: six requests miss the device cache at once and load from the store
    assert _outputs(loader.generate(prompts, 16)) == baseline.outputs["shared"]
    metrics = loader.metrics()
    assert counter(metrics, EXTERNAL) - counter(before, EXTERNAL) >= \
        whole_pages(prompts[:1], BLOCK) * BLOCK
    assert loader.reset_prefix_cache()
    # one at a time: the first loads every whole page, later ones only the pages past the
    # shared prefix (vLLM's device cache holds it by then)
    assert _one_by_one(loader, prompts, 16) == baseline.outputs["shared-singles"]
    after = loader.metrics()
    assert counter(after, EXTERNAL) - counter(metrics, EXTERNAL) == _singles_loaded(prompts)


def test_a_damaged_store_is_healed_in_one_pass(
        loader: Any, store: str, prompts: list[list[int]], baseline: Any) -> None:  # fmt: skip
    """Four pages damaged four ways: outputs stay identical; after one pass that fails to
    load them (and recomputes and saves them), the next read loads every page."""
    damaged = damage(store, 4)
    assert sorted(damaged.values()) == ["deleted", "flipped", "swapped", "truncated"]
    assert loader.reset_prefix_cache()
    before = loader.metrics()
    assert _one_by_one(loader, prompts, 16) == baseline.outputs["shared-singles"]
    first = loader.metrics()
    assert counter(first, EXTERNAL) - counter(before, EXTERNAL) < _singles_loaded(prompts)
    assert loader.reset_prefix_cache()
    assert _one_by_one(loader, prompts, 16) == baseline.outputs["shared-singles"]
    after = loader.metrics()
    assert counter(after, EXTERNAL) - counter(first, EXTERNAL) == _singles_loaded(prompts)
    assert counter(after, COMPUTED) - counter(first, COMPUTED) == \
        sum(len(p) for p in prompts) - whole_pages(prompts, BLOCK) * BLOCK


def test_wrong_kv_that_passes_every_check_changes_the_outputs(
        loader: Any, store: str, prompts: list[list[int]], baseline: Any) -> None:  # fmt: skip
    """The identity checks above can fail: pages swapped in pairs and re-keyed so that they
    verify (what a connector that landed the wrong page would load) give other tokens than
    the baseline, while vLLM counts every page as loaded. Runs last: it leaves the store
    wrong."""
    forge_swaps(store, 4)
    assert loader.reset_prefix_cache()
    before = loader.metrics()
    outputs = _one_by_one(loader, prompts, 16)
    assert counter(loader.metrics(), EXTERNAL) - counter(before, EXTERNAL) == \
        _singles_loaded(prompts)
    assert outputs != baseline.outputs["shared-singles"]


def test_a_redis_store_round_trips_with_token_chain_keys(
        smollm2: str, prompts: list[list[int]], start_node: Any, baseline: Any,
        redis_url: str) -> None:  # fmt: skip
    node = start_node(_spec(smollm2, redis_url, connector={"keys": "token_chain"}), "redis")
    assert _outputs(node.generate(prompts, 16)) == baseline.outputs["shared"]
    assert node.reset_prefix_cache()
    before = node.metrics()
    assert _one_by_one(node, prompts, 16) == baseline.outputs["shared-singles"]
    assert counter(node.metrics(), EXTERNAL) - counter(before, EXTERNAL) == \
        _singles_loaded(prompts)


def test_chunked_prefill_and_preemption_over_a_store(
        smollm2: str, tmp_path: Path, start_node: Any, baseline: Any) -> None:
    """Prompts of 10 blocks in a KV cache of 14: vLLM prefills in chunks of 256 tokens and
    preempts a running request when decoding needs a block; the connector saves chunk by
    chunk, and after the device cache is emptied the same batch loads from the store."""
    prompts = prompt_set(tokenizer_of(smollm2), "sched")
    new_tokens = PROMPT_SETS["sched"].new_tokens
    node = start_node(_spec(smollm2, f"file://{tmp_path}/pages", max_num_batched_tokens=256,
                            max_model_len=1536, num_gpu_blocks_override=14), "sched")
    assert _outputs(node.generate(prompts, new_tokens)) == baseline.outputs["sched"]
    assert counter(node.metrics(), PREEMPTIONS) > 0
    assert node.reset_prefix_cache()
    before = node.metrics()
    assert _outputs(node.generate(prompts, new_tokens)) == baseline.outputs["sched"]
    assert counter(node.metrics(), EXTERNAL) > counter(before, EXTERNAL)


def test_the_suite_ran_on_real_weights(smollm2: str) -> None:
    config = (Path(smollm2) / "config.json").read_text()
    assert "LlamaForCausalLM" in config
    assert (Path(smollm2) / "model.safetensors").stat().st_size > 100 << 20
