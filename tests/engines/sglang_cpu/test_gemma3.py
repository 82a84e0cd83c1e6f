"""Gemma-3-270M through ``RadixlinkLinker`` on real SGLang on CPU (fp32): a saver on an empty
store, then a fresh process loading the shared prefix; both token-identical to Gemma's cache-off
baseline (itself equal to HF transformers, test_models).

NOTE: Gemma 3 is a sliding-window model (5 local layers per global one, a 512-token window),
but SGLang 0.5.23 turns hybrid SWA memory off for Gemma 2/3
(``srt/arg_groups/model_overrides/gemma2_gemma3.py``: "Disable hybrid SWA memory ... as it is
not yet supported"): every layer keeps full K/V in one pool, so the linker sees a ``kv`` pool
only and stores every layer of every page. This test pins that down.
"""

from __future__ import annotations

from typing import Any

import pytest

from .kit import (
    PAGE,
    SHARED_PAGES,
    expected_store_tokens,
    outputs,
    prompt_set,
    serve,
    stored_pages,
    wait_for_pages,
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"file://{tmp_path_factory.mktemp('gemma-store')}/pages"


def test_gemma3_saves_and_a_fresh_process_loads_through_the_linker(
        gemma3: str, store: str, engines: Any,
        baseline: dict[tuple[str, str], list[Any]]) -> None:
    """Identical outputs on both; the fresh process takes exactly the pages its device tree
    lacks from the store; every stored page is a ``kv`` page (no ``swa`` pool in 0.5.23)."""
    from radixlink.integrations.sglang.engines import CacheMode, EngineSpec
    from radixlink.stores import open_store
    from radixlink.stores.keys import parse_key

    prompts = prompt_set(gemma3, "shared")
    assert len({tuple(p[:(SHARED_PAGES + 1) * PAGE]) for p in prompts}) == len(prompts)
    spec = EngineSpec(model=gemma3, cache=CacheMode.LINKER, store=store)
    saver, loader = engines([spec, spec], ["gemma-saver", "gemma-loader"])
    want = outputs(baseline[("gemma3", "shared")])

    saved = serve(saver, prompts)
    assert outputs(saved) == want
    assert [s.host for s in saved] == [0] * len(saved)
    wait_for_pages(store, stored_pages(prompts, outputs(saved)))

    loaded = serve(loader, prompts)
    assert outputs(loaded) == want
    assert [s.host for s in loaded] == expected_store_tokens(prompts)
    with open_store(store) as s:
        pools = {parse_key(key).pool.value for key, _ in s.scan()}  # type: ignore[union-attr]
    assert pools == {"kv"}
    assert "Disable hybrid SWA memory for Gemma3ForCausalLM" in saver.log_tail(10**6)
