"""Real SGLang on CPU (SmolLM2-135M, fp32) with ``RadixlinkLinker`` (the unified cache external
linker, ``dynamic`` backend) on a ``file://`` store: a saver on an empty store, a fresh process
that loads the shared prefix from it, damage to the store (flipped, deleted, swapped,
truncated pages), and a third fresh process that finds every page healed. Every output is
token-identical to the cache-off baseline (conftest), and SGLang's own counters say where the
prompt tokens came from (linker store hits are SGLang's ``cached_tokens_details.host``).

The flow, one request at a time (4 prompts of 620 tokens sharing 500; pages of 16 tokens):
  saver (empty store)   -> computes everything, offloads 39 + 3 x 8 = 63 pages (SGLang's tree
                           keeps each finished request's prompt and output)
  loader (fresh)        -> prompt 1: 38 pages from the store; prompts 2-4: 31 pages from its
                           device tree, the 7-page tails from the store
  damage 4 pages; loader flushes its tree and serves again
                        -> a request whose load batch holds a bad page is aborted (empty
                           output, never a wrong token); its retry is identical
  healed (fresh)        -> every page from the store again
"""

from __future__ import annotations

from typing import Any

import pytest

from .kit import (
    PAGE,
    SHARED_PAGES,
    damage,
    expected_store_tokens,
    outputs,
    prompt_set,
    serve,
    store_pages,
    stored_pages,
    wait_for_pages,
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"file://{tmp_path_factory.mktemp('linker-store')}/pages"


@pytest.fixture(scope="module")
def prompts(smollm2: str) -> list[list[int]]:
    return prompt_set(smollm2, "shared")


@pytest.fixture(scope="module")
def nodes(smollm2: str, store: str, engines: Any) -> dict[str, Any]:
    """Three fresh linker engines on one store, started side by side (each waits its turn)."""
    from radixlink.integrations.sglang.engines import CacheMode, EngineSpec

    names = ["saver", "loader", "healed"]
    spec = EngineSpec(model=smollm2, cache=CacheMode.LINKER, store=store)
    return dict(zip(names, engines([spec] * len(names), [f"linker-{n}" for n in names]),
                    strict=True))


@pytest.fixture(scope="module")
def saved(nodes: dict[str, Any], prompts: list[list[int]], store: str) -> list[Any]:
    out = serve(nodes["saver"], prompts)
    wait_for_pages(store, stored_pages(prompts, outputs(out)))
    return out


@pytest.fixture(scope="module")
def loaded(nodes: dict[str, Any], prompts: list[list[int]], saved: list[Any]) -> list[Any]:
    del saved
    return serve(nodes["loader"], prompts)


def test_a_saver_on_an_empty_store_matches_the_baseline_and_loads_nothing(
        saved: list[Any], baseline: dict[tuple[str, str], list[Any]], store: str,
        prompts: list[list[int]]) -> None:
    """Identical outputs; nothing from the store; every whole page of prompt and output
    offloaded."""
    assert outputs(saved) == outputs(baseline[("smollm2", "shared")])
    assert [s.host for s in saved] == [0] * len(saved)
    assert [s.device for s in saved[1:]] == [SHARED_PAGES * PAGE] * (len(saved) - 1)
    assert store_pages(store) == stored_pages(prompts, outputs(saved)) == 63


def test_a_fresh_process_loads_the_shared_prefix_from_the_store(
        loaded: list[Any], baseline: dict[tuple[str, str], list[Any]],
        prompts: list[list[int]]) -> None:
    """Identical outputs; exactly the pages its device tree does not hold come from the
    store (SGLang's ``cached_tokens_details.host``): 38 + 3 x 7 = 59 pages."""
    assert outputs(loaded) == outputs(baseline[("smollm2", "shared")])
    assert [s.host for s in loaded] == expected_store_tokens(prompts)
    assert [s.device for s in loaded] == [0] + [SHARED_PAGES * PAGE] * (len(loaded) - 1)
    assert sum(s.host for s in loaded) // PAGE == 59
    assert not any(s.aborted for s in loaded)


def test_a_damaged_store_aborts_never_lies_and_is_healed(
        nodes: dict[str, Any], loaded: list[Any], store: str, prompts: list[list[int]],
        baseline: dict[tuple[str, str], list[Any]]) -> None:
    """4 pages flipped, deleted, swapped and truncated through the store's primitives; the
    loader empties its tree and serves every prompt again. A request whose load batch holds a
    bad page is aborted by SGLang (empty output, finish ``abort``: SGLang's contract has one
    verdict per batch and no recompute fallback); every other output is identical, and so is
    each aborted request on retry. A fresh process then loads every page."""
    del loaded
    want = outputs(baseline[("smollm2", "shared")])
    damaged = damage(store, 4)
    assert sorted(damaged.values()) == ["deleted", "flipped", "swapped", "truncated"]
    loader = nodes["loader"]
    assert loader.flush_cache()
    first = serve(loader, prompts)
    aborted = [i for i, s in enumerate(first) if s.aborted]
    for i, served in enumerate(first):
        assert served.output_ids == ([] if i in aborted else want[i]), (i, served)
    assert 1 <= len(aborted) <= 3, [s.finish for s in first]  # the deleted page is a miss
    retried = serve(loader, [prompts[i] for i in aborted])
    assert outputs(retried) == [want[i] for i in aborted]
    assert not any(s.aborted for s in retried)

    healed = serve(nodes["healed"], prompts)
    assert outputs(healed) == want
    assert [s.host for s in healed] == expected_store_tokens(prompts)


def test_the_engines_logged_no_traceback(nodes: dict[str, Any]) -> None:
    """Failures were statuses, never exceptions into SGLang's scheduler: the bad batches are
    one warning line each, and no engine log holds a traceback."""
    text = "\n".join(node.log_tail(10**6) for node in nodes.values())
    assert "radixlink load batch" in text  # the damaged batches were reported
    assert "Traceback" not in text, text[-4000:]
