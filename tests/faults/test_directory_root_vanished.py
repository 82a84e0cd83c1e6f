"""Fault matrix, directory store whose root vanished mid-run (issue 24, item 13): the root is
replaced by a file (an unmounted disk, an operator's mistake). Every store call that fails
raises ``StoreError`` (the ``Store`` contract), never ``NotADirectoryError``, and a linker on
top serves recompute with exact accounting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from radixlink.contract import PoolName
from radixlink.errors import StoreError
from radixlink.stores import page_key
from radixlink.stores.directory import DirectoryStore

from .kit import MODEL_NS, TOKENS, assert_exact, make_cache, offload, request

KEYS = [page_key("aaaa", f"{i:064x}", PoolName.KV) for i in range(4)]


def _replace_root_with_a_file(root: Path) -> None:
    os.rename(root, root.with_name(root.name + ".gone"))
    root.write_bytes(b"not a directory")


def test_store_calls_raise_store_error_when_the_root_became_a_file(tmp_path: Path) -> None:
    """exists / put / delete / scan / gc / clear on a store whose root is now a file: each a
    ``StoreError`` naming the root (exists used to raise NotADirectoryError from os.lstat);
    get answers misses."""
    root = tmp_path / "store"
    store = DirectoryStore(root)
    assert store.put({key: b"page" for key in KEYS}) == [True] * 4
    _replace_root_with_a_file(root)
    calls = {
        "exists": lambda: store.exists(KEYS),
        "delete": lambda: store.delete(KEYS),
        "scan": lambda: list(store.scan()),
        "gc": store.gc,
        "clear": lambda: store.clear(),
    }
    for name, call in calls.items():
        with pytest.raises(StoreError, match=str(root)):
            call()
        assert name  # the loop names the failing call in the traceback
    assert store.get(KEYS) == [None] * 4
    assert store.put({KEYS[0]: b"new"}) == [False]


def test_a_linker_over_a_vanished_root_recomputes_and_leaks_nothing(tmp_path: Path, link) -> None:
    """Flow: node A offloads 10 pages; the root is replaced by a file; node B (same store
    object) asks for the same prefix: no exception reaches the engine, B recomputes (hit 0),
    its offload fails cleanly, and both caches keep exact accounting."""
    root = tmp_path / "store"
    store = DirectoryStore(root)
    cache_a = make_cache(namespace=MODEL_NS)
    offload(cache_a, link(cache_a, store))
    _replace_root_with_a_file(root)
    cache_b = make_cache(namespace=MODEL_NS)
    linker_b = link(cache_b, store)
    result = request(cache_b, linker_b, TOKENS, "b")
    assert result["hit"] == 0 and result["prefix"] == 0, result
    linker_b.flush(timeout=30)
    assert_exact(cache_a)
    assert_exact(cache_b)
