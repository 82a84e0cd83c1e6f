"""Real SGLang on CPU (SmolLM2-135M, fp32) with HiCache and ``RadixlinkHiCacheStorage`` as its
storage backend on a ``file://`` store (``--hicache-mem-layout layer_first
--hicache-io-backend direct``, prefetch ``wait_complete``): a saver on an empty store and a
fresh process that loads the shared prefix from storage, both token-identical to the cache-off
baseline; then damage to the store, which HiCache meets page by page: a bad page is a per-page
miss, the rest recomputed, and no request fails. SGLang counts HiCache hits as
``cached_tokens_details.storage``.
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
    return f"file://{tmp_path_factory.mktemp('hicache-store')}/pages"


@pytest.fixture(scope="module")
def prompts(smollm2: str) -> list[list[int]]:
    return prompt_set(smollm2, "shared")


@pytest.fixture(scope="module")
def nodes(smollm2: str, store: str, engines: Any) -> dict[str, Any]:
    from radixlink.integrations.sglang.engines import CacheMode, EngineSpec

    spec = EngineSpec(model=smollm2, cache=CacheMode.HICACHE, store=store)
    saver, loader = engines([spec, spec], ["hicache-saver", "hicache-loader"])
    return {"saver": saver, "loader": loader}


@pytest.fixture(scope="module")
def saved(nodes: dict[str, Any], prompts: list[list[int]], store: str) -> list[Any]:
    out = serve(nodes["saver"], prompts)
    wait_for_pages(store, stored_pages(prompts, outputs(out)))
    return out


def test_a_hicache_saver_writes_every_page_and_matches_the_baseline(
        saved: list[Any], baseline: dict[tuple[str, str], list[Any]]) -> None:
    """Identical outputs; nothing from storage on an empty store."""
    assert outputs(saved) == outputs(baseline[("smollm2", "shared")])
    assert [s.storage for s in saved] == [0] * len(saved)
    assert not any(s.aborted for s in saved)


def test_a_fresh_hicache_process_loads_the_shared_prefix_from_storage(
        nodes: dict[str, Any], saved: list[Any], prompts: list[list[int]],
        baseline: dict[tuple[str, str], list[Any]]) -> None:
    """Identical outputs; the first prompt's every whole page comes from storage (38 pages),
    later prompts take the shared prefix from the device and their tails from storage."""
    del saved
    loaded = serve(nodes["loader"], prompts)
    assert outputs(loaded) == outputs(baseline[("smollm2", "shared")])
    assert [s.storage for s in loaded] == expected_store_tokens(prompts)
    assert [s.device for s in loaded[1:]] == [SHARED_PAGES * PAGE] * (len(loaded) - 1)


def test_damage_through_hicache_fails_no_request(
        nodes: dict[str, Any], saved: list[Any], store: str, prompts: list[list[int]],
        baseline: dict[tuple[str, str], list[Any]]) -> None:
    """4 pages flipped, deleted, swapped and truncated; the loader empties its device and host
    tiers and serves again: every request finishes with the baseline's output; a bad page
    and the pages after it are recomputed (HiCache takes the good prefix)."""
    del saved
    before = store_pages(store)
    damage(store, 4)
    loader = nodes["loader"]
    assert loader.flush_cache()
    again = serve(loader, prompts)
    assert outputs(again) == outputs(baseline[("smollm2", "shared")])
    assert not any(s.aborted for s in again)
    assert sum(s.storage for s in again) > 0  # it read the store, not a host tier
    # some damaged page was met, and it and the pages after it were recomputed
    assert [s.storage for s in again] != expected_store_tokens(prompts)
    wait_for_pages(store, before)  # the recomputed pages were written back
