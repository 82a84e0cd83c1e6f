"""Two ``python -m sglang.launch_server`` processes with ``RadixlinkLinker`` on one store, each
on its own loopback port, and a real HTTP client (``POST /generate``, SGLang's native API):
the first computes and offloads, the second answers the same prompts from the first one's pages
(its ``meta_info.cached_tokens_details.host``). Both are token-identical to the cache-off
baseline.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from .kit import (
    Server,
    expected_store_tokens,
    outputs,
    prompt_set,
    stored_pages,
    wait_for_pages,
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"file://{tmp_path_factory.mktemp('server-store')}/pages"


@pytest.fixture(scope="module")
def servers(smollm2: str, store: str, logs: Path,
            standin_calls: Path) -> Iterator[list[Server]]:
    from radixlink.integrations.sglang.engines import CacheMode, EngineSpec

    del standin_calls
    spec = EngineSpec(model=smollm2, cache=CacheMode.LINKER, store=store)
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(Server, spec, logs / f"server{i}.log") for i in range(2)]
    started = [f.result() for f in futures if f.exception() is None]
    try:
        for future in futures:
            future.result()
        yield started
    finally:
        for server in started:
            server.close()


def test_a_second_server_answers_from_the_first_ones_pages(
        servers: list[Server], smollm2: str, store: str,
        baseline: dict[tuple[str, str], list[Any]]) -> None:
    """Server 0 serves the prompts (computing them), then server 1 serves them: identical
    outputs; server 1 takes exactly the pages its device tree lacks from the store."""
    prompts = prompt_set(smollm2, "servers")
    want = outputs(baseline[("smollm2", "servers")])
    first = [servers[0].generate(p) for p in prompts]
    assert [r["output_ids"] for r in first] == want
    assert all((r["meta_info"].get("cached_tokens_details") or {}).get("host", 0) == 0
               for r in first)
    wait_for_pages(store, stored_pages(prompts, [r["output_ids"] for r in first]))
    second = [servers[1].generate(p) for p in prompts]
    assert [r["output_ids"] for r in second] == want
    hosts = [(r["meta_info"].get("cached_tokens_details") or {}).get("host", 0) for r in second]
    assert hosts == expected_store_tokens(prompts)
