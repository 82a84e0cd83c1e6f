"""The one corrupt-page policy through the linker (``pages.pageio``): a load batch with TWO bad
pages at different positions counts both as misses with their reasons, deletes both from the
store, and the recompute's offload writes both again, even on the node whose record of known
pages said the store held them."""

from __future__ import annotations

from typing import Any

from radixlink.contract import PoolName
from radixlink.hashing import namespace_id, page_hashes
from radixlink.stores import Store, page_key

from .kit import PS, TOKENS, assert_exact, make_cache, offload, request, serve

OTHER = list(range(500, 540))  # 10 pages that need the room TOKENS holds


def _keys(cache: Any) -> list[str]:
    ns = cache.config.namespace
    return [page_key(namespace_id(ns), h, PoolName.KV, rank=0)
            for h in page_hashes(TOKENS, PS, ns, algo=cache.config.hash_algo)]


def _damage(store: Store, keys: list[str]) -> None:
    """Page 2: one payload byte flipped (checksum); page 7: cut short (truncated)."""
    flipped = bytearray(store.get([keys[2]])[0])
    flipped[-1] ^= 0xFF
    cut = store.get([keys[7]])[0]
    store.put({keys[2]: bytes(flipped), keys[7]: cut[: len(cut) // 2]})


def test_two_bad_pages_are_counted_deleted_and_written_again(store, link) -> None:
    """Flow: A offloads 10 pages; two are damaged; B's load finds all 10 present, fails with
    a checksum and a truncated miss, and both pages are gone from the store (the others
    stay); B's recompute writes them again, so C loads all 10 verified."""
    writer = make_cache()
    offload(writer, link(writer, store))
    keys = _keys(writer)
    assert all(store.exists(keys))
    _damage(store, keys)
    reader = make_cache()
    linker = link(reader, store, write_policy="write_back")  # NOTE: no rewrite before we look
    got = request(reader, linker, TOKENS, "victim")
    assert got["hit"] == 40 and got["ok"] is False, got
    misses = linker.stats()["codec_misses"]
    assert misses["checksum"] == 1 and misses["truncated"] == 1 and misses["misses"] == 2
    assert store.exists(keys) == [i not in (2, 7) for i in range(10)]
    assert_exact(reader)
    healer = make_cache()
    offload(healer, link(healer, store))  # lookup: 2 pages, recompute and write the rest
    assert all(store.exists(keys))
    last = make_cache()
    got = request(last, link(last, store), TOKENS, "served")
    assert got["ok"] is True and got["prefix"] == 40, got


def test_a_page_the_node_knew_as_stored_is_written_again_after_a_bad_load(store, link) -> None:
    """Flow: a node offloads 10 pages (its record knows them), evicts them, two are damaged;
    its own reload fails and deletes both; the recompute writes them again instead of
    skipping them as known, so another node loads all 10."""
    cache = make_cache(num_tokens=64)
    linker = link(cache, store)
    offload(cache, linker)
    serve(cache, OTHER)  # needs the room: evicts TOKENS
    assert linker.flush(timeout=30)
    assert cache.match_prefix(TOKENS).prefix_len == 0
    keys = _keys(cache)
    _damage(store, keys)
    got = request(cache, linker, TOKENS, "again")
    assert got["hit"] == 40 and got["ok"] is False, got
    assert linker.flush(timeout=30)
    assert all(store.exists(keys)), store.exists(keys)
    other = make_cache()
    got = request(other, link(other, store), TOKENS, "served")
    assert got["ok"] is True and got["prefix"] == 40, got
