"""The one corrupt-page policy (``pages.pageio``) in both SGLang integrations: a batch with TWO
bad pages at different positions counts both, deletes both from the store (the linker used to
quarantine them locally, the HiCache backend left them in place), and the next save writes
both again. Both run their transfers on the page layer's ``TransferEngine``: its one stats
record counts the bad pages and the rewrites."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from .conftest import SGLANG_MISSING

pytest.importorskip("sglang", reason=SGLANG_MISSING)

import torch  # noqa: E402

from radixlink.integrations.sglang.hashing_compat import sglang_storage_page_hashes  # noqa: E402
from radixlink.stores import Store  # noqa: E402
from radixlink.stores.registry import open_store  # noqa: E402

from .harness import FULL  # noqa: E402
from .hicache_harness import (  # noqa: E402
    PAGE,
    saved,
    tokens_of,
)

PROMPT = list(range(3000, 3040))  # 10 pages of 4


def _damage(store: Store, flip: str, cut: str) -> None:
    blob = bytearray(store.get([flip])[0])
    blob[len(blob) // 2] ^= 0x01
    whole = store.get([cut])[0]
    store.put({flip: bytes(blob), cut: whole[: len(whole) // 2]})


def _kv_key(store: Store, page_hash: str) -> list[str]:
    return [k for k, _ in store.scan() if f"/{page_hash}/kv" in k]


def test_linker_two_bad_pages_are_deleted_and_written_again(file_url, nodes) -> None:
    """Pages 3 (flipped byte) and 7 (cut short) of A's prompt: B's load fails, both pages are
    gone from the store, B's retry restores pages 0..2; C's save writes both again (and no
    page the store still holds) and D restores all 10 pages byte-identically: those two C's,
    the others A's (each node's test KV is its own)."""
    hashes = sglang_storage_page_hashes(PROMPT, 4)
    a, b = nodes(FULL, file_url, 1), nodes(FULL, file_url, 2)
    a_slots = a.serve(PROMPT)
    with open_store(file_url) as store:
        (flip,), (cut,) = _kv_key(store, hashes[3]), _kv_key(store, hashes[7])
        _damage(store, flip, cut)
    first = b.restore(PROMPT, "r1")
    assert (first.loaded_len, first.failed) == (40, True)
    stats = b.linker.stats()
    assert (stats["load_jobs"], stats["failed_jobs"], stats["fetched_pages"],
            stats["bad_pages"], stats["missing_pages"]) == (1, 1, 10, 2, 0)
    b.release(first)
    with open_store(file_url) as store:
        assert store.exists([flip, cut]) == [False, False]
        assert len(list(store.scan())) == 8
    second = b.restore(PROMPT, "r2")
    assert (second.loaded_len, second.failed) == (12, False)
    stats = b.linker.stats()
    assert (stats["load_jobs"], stats["failed_jobs"], stats["bad_pages"]) == (2, 1, 2)
    c = nodes(FULL, file_url, 3)
    c_slots = c.serve(PROMPT)
    assert c.linker.stats()["saved_pages"] == 2
    with open_store(file_url) as store:
        assert store.exists([flip, cut]) == [True, True]
    _restores_whole(nodes(FULL, file_url, 4), "r3",
                    lambda page: [(c, c_slots) if page in (3, 7) else (a, a_slots)])


def test_linker_a_damaged_page_behind_a_missing_one_is_rewritten_in_one_pass(
        file_url, nodes) -> None:
    """Page 3 of A's prompt deleted, page 7 flipped: B's lookup stops at page 3, so page 7 is
    never read; B recomputes pages 3..9 and its offload writes page 7 again although the
    store holds it (offloads skip stored pages, but not ones a lookup found past its restore
    point). D then restores all 10 pages, 3..9 B's (0..2 are A's, or B's where B's offload
    of the node that holds them wrote them again)."""
    hashes = sglang_storage_page_hashes(PROMPT, 4)
    a, b = nodes(FULL, file_url, 1), nodes(FULL, file_url, 2)
    a_slots = a.serve(PROMPT)
    with open_store(file_url) as store:
        (gone,), (flip,) = _kv_key(store, hashes[3]), _kv_key(store, hashes[7])
        blob = bytearray(store.get([flip])[0])
        blob[len(blob) // 2] ^= 0x01
        store.put({flip: bytes(blob)})
        store.delete([gone])
    got = b.restore(PROMPT, "r1")
    assert (got.loaded_len, got.failed) == (12, False)
    assert (b.linker.stats()["fetched_pages"], b.linker.stats()["bad_pages"]) == (3, 0)
    b_slots = b.serve(PROMPT)
    assert b.linker.stats()["saved_pages"] >= 7
    _restores_whole(nodes(FULL, file_url, 4), "r2",
                    lambda page: [(b, b_slots)] if page >= 3 else [(a, a_slots), (b, b_slots)])


def _restores_whole(node: Any, rid: str, writers: Callable[[int], list[tuple[Any, Any]]]
                    ) -> None:
    """``node`` restores all 10 pages of PROMPT from the store, each page's K/V rows those
    of one of ``writers(page)`` (a node and the slots it served PROMPT into)."""
    got = node.restore(PROMPT, rid)
    assert (got.loaded_len, got.failed) == (40, False)
    have = node.full_bytes(got.slots)
    for page in range(10):
        rows = slice(page * 4, page * 4 + 4)
        assert any(all(torch.equal(x, y[rows])
                       for x, y in zip(src.full_bytes(slots[rows]), have, strict=True))
                   for src, slots in writers(page)), page


def test_hicache_two_bad_pages_are_deleted_and_written_again(file_url: str) -> None:
    """Pages 1 and 4 of 6 damaged: both read False (their neighbours load), both are deleted,
    so presence stops at page 1 and SGLang's write-back sets them again; then all 6 load."""
    prompt = list(range(7, 7 + 6 * PAGE))
    node, pool, keys, src = saved(file_url, prompt, seed=6)
    store = open_store(file_url)
    (flip,), (cut,) = _kv_key(store, keys[1]), _kv_key(store, keys[4])
    _damage(store, flip, cut)
    dst = pool.alloc(len(prompt))
    assert node.batch_get_v1(keys, dst) == [True, False, True, True, False, True]
    assert store.exists([flip, cut]) == [False, False]
    stats = node.stats()
    assert (stats["load_jobs"], stats["fetched_pages"], stats["bad_pages"],
            stats["saved_pages"]) == (1, 6, 2, 6)
    assert node.batch_exists(keys) == 1
    assert all(node.batch_set_v1(keys, src))
    assert node.batch_exists(keys) == 6
    stats = node.stats()
    assert (stats["offload_jobs"], stats["saved_pages"], stats["healed_pages"]) == (2, 12, 2)
    again = pool.alloc(len(prompt))
    assert node.batch_get_v1(keys, again) == [True] * 6
    assert all(torch.equal(x, y) for x, y in zip(tokens_of(pool, again), tokens_of(pool, src)))
    store.close()
    node.close()


def test_linker_streams_a_cpu_load_chunk_by_chunk_and_fails_it_on_a_late_bad_page(
        file_url, nodes, monkeypatch) -> None:
    """On CPU pools a load is streamed (``workers.ChunkLanding``), here one page a chunk: a
    whole load lands every page byte-identically; a bad page 8 fails the batch after pages
    0..7 were copied into its private slots, no layer is reported landed, and once the
    scheduler frees them every slot is back with the allocator."""
    from radixlink.pages import stream

    monkeypatch.setattr(stream, "CHUNK_BYTES", 1)  # NOTE: at least one page: a page a chunk
    hashes = sglang_storage_page_hashes(PROMPT, 4)
    a, b = nodes(FULL, file_url, 1), nodes(FULL, file_url, 2)
    a_slots = a.serve(PROMPT)
    whole = b.restore(PROMPT, "r1")
    assert (whole.loaded_len, whole.failed) == (40, False)
    want, have = a.full_bytes(a_slots), b.full_bytes(whole.slots)
    assert all(torch.equal(x, y) for x, y in zip(want, have, strict=True))
    c = nodes(FULL, file_url, 3)
    with open_store(file_url) as store:
        (late,) = _kv_key(store, hashes[8])
        blob = bytearray(store.get([late])[0])
        blob[-9] ^= 0x01
        store.put({late: bytes(blob)})
    free_before = c.allocator.available_size()
    failed = c.restore(PROMPT, "r2")
    assert (failed.loaded_len, failed.failed) == (40, True)
    assert c.linker.stats()["bad_pages"] == 1
    want, have = a.full_bytes(a_slots[:32]), c.full_bytes(failed.slots[:32])
    assert all(torch.equal(x, y) for x, y in zip(want, have, strict=True))  # landed, unused
    c.release(failed)
    assert c.allocator.available_size() == free_before
