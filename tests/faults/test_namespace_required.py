"""Isolation never rests on a missing namespace (issue #24, item 12): a linker on a store other
processes reach refuses a cache without a model namespace, so a full-attention cache can no
longer load pages a different (hybrid) model wrote just because the KV layouts match."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixlink.hashing import Namespace
from radixlink.linker.core import ExternalCacheLinker
from radixlink.stores.directory import DirectoryStore
from radixlink.stores.faults import FaultyStore
from radixlink.stores.memory import MemoryStore
from radixlink.stores.tiered import TieredStore

from .kit import TOKENS, assert_exact, make_cache, offload, request


@pytest.mark.parametrize("namespace", [None, Namespace(cache_salt="tenant")])
def test_a_shared_store_refuses_a_cache_without_a_model_namespace(tmp_path: Path,
                                                                  namespace: object) -> None:
    """file:// (as a URL, a store, wrapped in faults or behind a memory front) refuses a
    cache whose namespace names no model, with a message saying what to pass; nothing is left
    attached, and the cache works on without a linker."""
    cache = make_cache(namespace=namespace)  # type: ignore[arg-type]
    stores = [f"file://{tmp_path}/a", DirectoryStore(tmp_path / "b"),
              FaultyStore(DirectoryStore(tmp_path / "c")),
              TieredStore(MemoryStore(), DirectoryStore(tmp_path / "d"))]
    for store in stores:
        with pytest.raises(ValueError, match=r"needs a model namespace.*Namespace\(model="):
            ExternalCacheLinker(cache, store)
        assert cache.linker is None
    assert request(cache, None, TOKENS, None)["prefix"] == 0
    assert_exact(cache)


def test_a_process_private_memory_store_needs_no_namespace() -> None:
    """memory:// (and faults over it) is private to the process: no namespace is needed."""
    for store in ("memory://", FaultyStore(MemoryStore())):
        cache = make_cache(namespace=None)
        with ExternalCacheLinker(cache, store) as linker:
            offload(cache, linker)
        assert_exact(cache)


def test_two_models_with_one_kv_layout_never_share_pages(tmp_path: Path) -> None:
    """Two models with the same KV layout, each with its model namespace, on one directory:
    the second finds nothing of the first's pages; the first finds all of its own."""
    url = f"file://{tmp_path}/shared"
    hybrid = make_cache(namespace=Namespace(model="hybrid-model"))
    with ExternalCacheLinker(hybrid, url) as linker:
        offload(hybrid, linker, namespace=None)
    full = make_cache(namespace=Namespace(model="full-model"))
    with ExternalCacheLinker(full, url) as linker:
        assert request(full, linker, TOKENS, "r")["hit"] == 0
    again = make_cache(namespace=Namespace(model="hybrid-model"))
    with ExternalCacheLinker(again, url) as linker:
        assert request(again, linker, TOKENS, "r")["hit"] == len(TOKENS)
    for cache in (full, again):
        assert_exact(cache)
