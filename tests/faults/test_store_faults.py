"""Fault matrix, store side: errors on lookup / get / put, timeouts, corrupt, truncated, foreign
and malformed payloads, a full disk. Every case serves the request anyway (recompute), never
raises into the engine, and ends with exact accounting and only verified pages in the tree."""

from __future__ import annotations

import shutil
import struct
import time
from collections.abc import Callable

import pytest

from radixlink.stores.codec import HEADER_BYTES, PageCodec
from radixlink.stores.directory import DirectoryStore
from radixlink.stores.faults import FaultyStore
from radixlink.stores.memory import MemoryStore

from .kit import LAYOUT, MODEL_NS, TOKENS, assert_exact, kv_codec, make_cache, offload, request


def _rewrite(store: MemoryStore, fn: Callable[[str, bytes], bytes]) -> int:
    """Replace every stored page by ``fn(key, page)``; returns how many."""
    keys = [key for key, _ in store.scan()]
    store.put({key: fn(key, blob) for key, blob in zip(keys, store.get(keys), strict=True)})
    return len(keys)


def _other_layout(key: str, blob: bytes) -> bytes:
    """The same bytes as written by a writer whose KV layout is float16 (same page size)."""
    payload = kv_codec().decode(blob, key)
    assert payload is not None
    other = PageCodec(LAYOUT.fingerprint().replace("float32", "float16"), LAYOUT.page_bytes)
    return other.encode(payload, key)


def _patch(offset: int, value: bytes) -> Callable[[str, bytes], bytes]:
    return lambda key, blob: blob[:offset] + value + blob[offset + len(value) :]


def _short(key: str, blob: bytes) -> bytes:
    """A well-formed page of the right layout whose payload is half a page."""
    payload = kv_codec().decode(blob, key)
    assert payload is not None
    return kv_codec().encode(payload[: LAYOUT.page_bytes // 2], key)


# offset of the u64 payload length in the header (see codec._HEADER)
_LENGTH_AT = 40  # the payload length field (docs/stores.md, page format)

BAD_PAYLOADS = {
    "other_layout": (_other_layout, "fingerprint"),
    "format_version": (_patch(4, b"\x01"), "version"),
    "foreign_magic": (_patch(0, b"JUNK"), "bad_magic"),
    "length_beyond_page": (_patch(_LENGTH_AT, struct.pack("<Q", 1 << 40)), "length"),
    "half_page": (_short, None),
    "torn_tail": (lambda key, blob: blob[: len(blob) - 100], "truncated"),
    "flipped_payload_byte": (_patch(HEADER_BYTES + 7, b"\xaa"), "checksum"),
}


def _recovered(cache, linker, result, *, failures: str) -> None:
    """The failed load cost only recomputation: the request got its device prefix (0), the
    recomputed prefix is now cached and verified, accounting is exact."""
    assert result["hit"] == 40 and result["ok"] is False and result["prefix"] == 0, result
    assert cache.match_prefix(TOKENS).prefix_len == 40
    assert linker.stats()[failures] == 1, linker.stats()
    assert linker.flush(timeout=30)
    assert_exact(cache)


@pytest.mark.parametrize("case", sorted(BAD_PAYLOADS))
def test_bad_payload_is_a_counted_miss_and_never_enters_the_tree(store, link, case) -> None:
    """Pages another layout or format version wrote, foreign or malformed ones, torn or
    corrupt ones: the load fails verification, nothing is published, the engine recomputes."""
    fn, reason = BAD_PAYLOADS[case]
    cache_a = make_cache(namespace=MODEL_NS)
    offload(cache_a, link(cache_a, store))
    assert _rewrite(store, fn) == 10
    cache_b = make_cache(namespace=MODEL_NS)
    linker_b = link(cache_b, store)
    result = request(cache_b, linker_b, TOKENS, "r")
    _recovered(cache_b, linker_b, result, failures="failures_load")
    misses = linker_b.stats()["codec_misses"]
    if reason is None:
        assert sum(misses.values()) == 0, misses  # caught after decoding: "short page"
        assert result["reason"] == "short page"
    else:
        assert misses[reason] >= 1, misses


@pytest.mark.parametrize(
    ("knobs", "reason"),
    [
        ({"fail": 1.0, "ops": ("get",)}, "StoreError"),
        ({"corrupt": 1.0}, "bad page"),
        ({"truncate": 1.0}, "bad page"),
    ],
)
def test_injected_get_fault_fails_the_load_only(store, link, knobs, reason) -> None:
    """A store error, a flipped byte or a cut value on get: ok=False with the device prefix,
    the request recomputes, nothing unverified is published."""
    cache_a = make_cache(namespace=MODEL_NS)
    offload(cache_a, link(cache_a, store))
    cache_b = make_cache(namespace=MODEL_NS)
    linker_b = link(cache_b, FaultyStore(store, **knobs))
    result = request(cache_b, linker_b, TOKENS, "r")
    assert reason in result["reason"]
    _recovered(cache_b, linker_b, result, failures="failures_load")


def test_pages_evicted_between_lookup_and_get_fail_the_load(store, link) -> None:
    """The store evicts after LOOKUP said yes: the get misses, the load aborts cleanly."""
    cache_a = make_cache(namespace=MODEL_NS)
    offload(cache_a, link(cache_a, store))
    cache_b = make_cache(namespace=MODEL_NS)
    linker_b = link(cache_b, store)
    assert cache_b.match_prefix(TOKENS, req_id="r").external_hit_len == 40
    store.clear()
    assert linker_b.load("r")
    out = linker_b.wait_load("r", timeout=30)
    assert not out.ok and out.prefix_len == 0 and "bad page" in out.reason
    cache_b.unlock(out.lock)
    assert_exact(cache_b)


def test_lookup_error_is_a_miss_and_the_request_recomputes(store, link) -> None:
    """exists() raising StoreError: no external hit, counted, the request computes everything."""
    cache_a = make_cache(namespace=MODEL_NS)
    offload(cache_a, link(cache_a, store))
    cache_b = make_cache(namespace=MODEL_NS)
    linker_b = link(cache_b, FaultyStore(store, fail=1.0, ops=("exists",)))
    result = request(cache_b, linker_b, TOKENS, "r")
    assert result == {"device": 0, "hit": 0, "prefix": 0, "ok": None, "reason": ""}
    assert linker_b.stats()["failures_lookup"] == 1
    assert linker_b.flush(timeout=30)
    assert_exact(cache_b)


@pytest.mark.parametrize("via", ["wait_load", "poll"])
def test_get_slower_than_the_timeout_fails_now_and_frees_later(store, link, via) -> None:
    """A get slower than load_timeout_s: wait_load (or poll's expiry) reports ok=False
    "timeout" at the deadline; the reserved slots stay held until the worker returns (no
    write into freed memory), then are freed; nothing is published."""
    cache_a = make_cache(namespace=MODEL_NS)
    offload(cache_a, link(cache_a, store))
    cache_b = make_cache(namespace=MODEL_NS)
    linker_b = link(cache_b, FaultyStore(store, delay_ms=600, ops=("get",)), load_timeout_s=0.2)
    assert cache_b.match_prefix(TOKENS, req_id="r").external_hit_len == 40
    assert linker_b.load("r")
    started = time.monotonic()
    if via == "wait_load":
        out = linker_b.wait_load("r")
    else:
        outs = []
        while not outs:
            outs = linker_b.poll()
            time.sleep(0.01)
        (out,) = outs
    assert not out.ok and out.reason == "timeout" and time.monotonic() - started < 0.55
    assert cache_b.stats()["held_tokens"] == 40  # still reserved: the worker may write there
    cache_b.unlock(out.lock)
    assert linker_b.flush(timeout=30)
    assert cache_b.match_prefix(TOKENS).prefix_len == 0
    assert linker_b.stats()["failures_timeout"] == 1
    assert_exact(cache_b)


def test_late_request_does_not_join_a_timed_out_transfer(store, link) -> None:
    """Flow: request 1's get hangs past the timeout -> it fails; the store recovers; request 2
    for the same pages starts its own transfer (it must not share the doomed one) and loads."""
    cache_a = make_cache(namespace=MODEL_NS)
    offload(cache_a, link(cache_a, store))
    faulty = FaultyStore(store, delay_ms=1400, ops=("get",))
    cache_b = make_cache(namespace=MODEL_NS)
    linker_b = link(cache_b, faulty, load_timeout_s=0.8)
    cache_b.match_prefix(TOKENS, req_id="r1")
    assert linker_b.load("r1")
    first = linker_b.wait_load("r1")
    assert not first.ok and first.reason == "timeout"
    cache_b.unlock(first.lock)
    faulty.delay_ms = 0
    assert cache_b.match_prefix(TOKENS, req_id="r2").external_hit_len == 40
    assert linker_b.load("r2")
    second = linker_b.wait_load("r2")
    assert second.ok and second.prefix_len == 40, second.reason
    cache_b.unlock(second.lock)
    assert linker_b.stats()["loads_started"] == 2
    assert linker_b.flush(timeout=30)
    assert_exact(cache_b)


@pytest.mark.parametrize(
    "knobs", [{"fail": 1.0, "ops": ("put",)}, {"enospc": 1.0}, {"enospc": 0.5, "seed": 3}]
)
def test_failed_offload_marks_nothing_and_retries_later(store, link, knobs) -> None:
    """put raising, or refusing every / some pages (disk full): the offload is counted as
    failed, no node is marked stored, a peer loads at most what really reached the store,
    and the next hit after the store recovers offloads again."""
    faulty = FaultyStore(store, **knobs)
    cache_a = make_cache(namespace=MODEL_NS)
    linker_a = link(cache_a, faulty)
    request(cache_a, linker_a, TOKENS, "a1")
    assert linker_a.flush(timeout=30)
    assert linker_a.stats()["failures_offload"] == 1
    assert not any(node.external_cache_stored for node in cache_a.tree.iter_nodes())
    cache_b = make_cache(namespace=MODEL_NS)
    result = request(cache_b, link(cache_b, store), TOKENS, "b1")
    assert result["ok"] in (None, True) and result["hit"] < 40
    faulty.fail = faulty.enospc = 0.0
    request(cache_a, linker_a, TOKENS, "a2")
    assert linker_a.flush(timeout=30)
    assert cache_a.match_prefix(TOKENS).last_node.external_cache_stored
    assert_exact(cache_a)
    assert_exact(cache_b)


def test_directory_store_out_of_space(tmp_path, link) -> None:
    """A directory store refusing every write (ENOSPC via the fault wrapper): offloads fail
    and are counted, requests are served from device, a peer sees nothing to load."""
    faulty = FaultyStore(DirectoryStore(tmp_path), enospc=1.0)
    cache_a = make_cache(namespace=MODEL_NS)
    linker_a = link(cache_a, faulty)
    for i in range(3):
        request(cache_a, linker_a, TOKENS[: 16 + 8 * i], f"r{i}")
    assert linker_a.flush(timeout=30)
    stats = linker_a.stats()
    assert stats["failures_offload"] >= 1 and stats.get("offloaded_pages", 0) == 0, stats
    assert faulty.stats()["faults"]["enospc"] >= 4 and list(faulty.scan()) == []
    cache_b = make_cache(namespace=MODEL_NS)
    assert request(cache_b, link(cache_b, DirectoryStore(tmp_path)), TOKENS, "b")["hit"] == 0
    assert_exact(cache_a)
    assert_exact(cache_b)


def test_store_directory_turning_unusable_is_a_miss_not_a_crash(tmp_path, link) -> None:
    """The store directory is replaced by a file under a running linker (an OSError such as
    ENOTDIR/EIO from the backend, not a StoreError): lookups are counted misses, offloads
    fail, revalidation fails, requests are served from device; nothing raises."""
    root = tmp_path / "store"
    cache = make_cache(namespace=MODEL_NS)
    linker = link(cache, DirectoryStore(root), revalidate_after_s=0.0)
    offload(cache, linker)
    shutil.rmtree(root)
    root.write_text("not a directory any more")
    other = list(range(300, 340))
    assert request(cache, linker, other, "r1")["hit"] == 0
    assert request(cache, linker, TOKENS, "r2")["prefix"] == 40  # revalidates a stale mark
    assert linker.flush(timeout=30)
    stats = linker.stats()
    assert stats["failures_lookup"] == 1 and stats["failures_offload"] == 1, stats
    assert stats["failures_revalidate"] >= 1, stats
    assert_exact(cache)
