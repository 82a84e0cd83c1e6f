"""Pages name their key and, with a secret, are sealed: a page copied under another tenant's key,
a batch a store returns in the wrong order, and a page forged by a writer without the secret
are counted misses. The request recomputes and is served only its own K/V (issue 14, item 1)."""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import xxhash

from radixlink.hashing import Namespace
from radixlink.stores import Store, open_store
from radixlink.stores.codec import HEADER_BYTES, TAG_BYTES, key_digest
from radixlink.stores.keys import KEY_PREFIX

from .kit import LAYOUT, TOKENS, assert_exact, kv_codec, make_cache, offload, request

MODEL = Namespace(model="tiny@1", layout=LAYOUT.fingerprint())
TENANT_A = Namespace(model="tiny@1", layout=LAYOUT.fingerprint(), extra_key="tenant-a")
TENANT_B = Namespace(model="tiny@1", layout=LAYOUT.fingerprint(), extra_key="tenant-b")
SECRET_VAR = "RADIXLINK_TEST_PAGE_SECRET"
SECRET = "0123456789abcdef0123456789abcdef"


class RotatingStore(Store):
    """A store whose batch get answers one position off (the last value first): every page
    comes back under its neighbour's key, as a store mixing up a pipelined reply would."""

    def __init__(self, inner: Store):
        self.inner = inner

    def exists(self, keys: Sequence[str]) -> list[bool]:
        return self.inner.exists(keys)

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        values = self.inner.get(keys)
        return values[-1:] + values[:-1]

    def put(self, items: Mapping[str, bytes]) -> list[bool]:
        return self.inner.put(items)

    def delete(self, keys: Sequence[str]) -> int:
        return self.inner.delete(keys)

    def scan(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        return self.inner.scan(prefix)


def _keys(store: Store) -> list[str]:
    return sorted(key for key, _ in store.scan())


def _expect_recompute(cache: Any, linker: Any, reason: str, namespace: Any = None) -> None:
    """The store claims every page (40 tokens), the load fails verification with 10 misses of
    ``reason``, the request recomputes, and the tree holds only verified pages."""
    result = request(cache, linker, TOKENS, "victim", namespace=namespace)
    assert result["hit"] == 40 and result["ok"] is False and result["prefix"] == 0, result
    misses = linker.stats()["codec_misses"]
    assert misses[reason] == 10 and misses["misses"] == 10, misses
    assert linker.flush(timeout=30)
    assert_exact(cache)


def test_pages_copied_under_another_tenants_keys_are_misses(store, link) -> None:
    """Flow: tenants A and B (same model and layout) offload the same tokens; a writer with
    store access copies A's pages over B's keys. B's next load finds every page present, but
    each names A's key: 10 ``key`` misses, B recomputes and is never served A's K/V."""
    cache_a = make_cache(namespace=TENANT_A)
    offload(cache_a, link(cache_a, store))
    keys_a = _keys(store)
    cache_b = make_cache(namespace=TENANT_B)
    offload(cache_b, link(cache_b, store))
    keys_b = sorted(set(_keys(store)) - set(keys_a))
    assert len(keys_a) == len(keys_b) == 10
    store.put(dict(zip(keys_b, store.get(keys_a), strict=True)))
    victim = make_cache(namespace=TENANT_B)
    _expect_recompute(victim, link(victim, store), "key")


def test_a_batch_returned_in_the_wrong_order_is_misses_not_data(store, link) -> None:
    """A store that answers a batch get one position off (real pages, valid checksums, same
    namespace): every page names another key, so the load fails instead of scattering 10
    wrong pages into the pool."""
    writer = make_cache(namespace=MODEL)
    offload(writer, link(writer, store))
    reader = make_cache(namespace=MODEL)
    _expect_recompute(reader, link(reader, RotatingStore(store)), "key")


@pytest.fixture
def sealed_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A directory store whose pages are sealed with the secret in ``SECRET_VAR``."""
    monkeypatch.setenv(SECRET_VAR, SECRET)
    return f"file://{tmp_path}/store?auth=env:{SECRET_VAR}"


def test_a_writer_without_the_secret_cannot_inject_pages(sealed_url: str, link) -> None:
    """Flow: a tenant's linker on a sealed store offloads; a writer with store access but no
    secret overwrites each page with its own K/V under the right key (correct key digest and
    checksum), once unsealed and once marked sealed (flags and the store's MAC id) with the
    real page's tag copied over. Both are ``auth`` misses; the tenant recomputes."""
    sealed = open_store(sealed_url)
    assert sealed.page_secret == SECRET.encode()
    owner = make_cache(namespace=MODEL)
    offload(owner, link(owner, sealed))
    plain = open_store(sealed_url.split("?")[0])  # the attacker: same directory, no secret
    assert plain.page_secret is None
    keys = _keys(plain)
    originals = plain.get(keys)
    forger = kv_codec()
    evil = {key: forger.encode(b"\x7f" * LAYOUT.page_bytes, key) for key in keys}
    assert plain.put(evil) == [True] * 10
    victim = make_cache(namespace=MODEL)
    _expect_recompute(victim, link(victim, sealed), "auth")
    # marked sealed (flags byte 6, MAC id byte 7: blake3), with the real page's tag appended
    marked = {
        key: blob[:6] + b"\x01\x01" + blob[8:] + original[-TAG_BYTES:]  # type: ignore[index]
        for (key, blob), original in zip(evil.items(), originals, strict=True)
    }
    plain.put(marked)
    victim = make_cache(namespace=MODEL)
    _expect_recompute(victim, link(victim, sealed), "auth")
    assert HEADER_BYTES + LAYOUT.page_bytes + TAG_BYTES == len(originals[0] or b"")


def test_sealed_pages_load_with_the_secret_and_not_without(sealed_url: str, link) -> None:
    """Sealed pages load, byte-exact, through a linker holding the secret; a linker without it
    cannot verify them and treats them as ``auth`` misses (it never trusts unverified KV)."""
    owner = make_cache(namespace=MODEL)
    offload(owner, link(owner, open_store(sealed_url)))
    reader = make_cache(namespace=MODEL)
    result = request(reader, link(reader, open_store(sealed_url)), TOKENS, "r", namespace=None)
    assert (result["hit"], result["ok"], result["prefix"]) == (40, True, 40)
    assert_exact(reader)
    no_secret = make_cache(namespace=MODEL)
    _expect_recompute(no_secret, link(no_secret, open_store(sealed_url.split("?")[0])), "auth")


def test_the_secret_never_shows(sealed_url: str) -> None:
    """Neither the store's repr and stats nor a bad-URL error contain the secret; a literal
    secret in the URL is refused without echoing it."""
    store = open_store(sealed_url)
    shown = repr(store) + repr(store.stats())
    assert SECRET not in shown and "'sealed': True" in shown
    with pytest.raises(ValueError) as info:
        open_store(f"memory://?auth={SECRET}")
    assert SECRET not in str(info.value) and "env:VARNAME" in str(info.value)
    with pytest.raises(ValueError, match="not set"):
        open_store("memory://?auth=env:RADIXLINK_TEST_UNSET_VARIABLE")


def test_pages_of_the_previous_format_are_never_found(store) -> None:
    """Keys carry the format version, so a page stored under a v3 key is not found by its v4
    key; format-1 and format-2 payloads, and a whole format-3 page (a 56-byte header) under a
    v4 key are ``version`` misses."""
    key = f"{KEY_PREFIX}_/" + "ab" * 32 + "/kv"
    assert key.startswith("v4/")
    codec = kv_codec()
    for version in (1, 2):
        old = b"RXLP" + bytes([version, 2, 0, 0]) + bytes(32) + b"x" * 16
        assert codec.decode(old, key) is None
    payload = b"p" * codec.page_bytes
    fingerprint = hashlib.blake2b(codec.fingerprint.encode(), digest_size=16).digest()
    v3 = struct.pack("<4sBBBB16s16sQQ", b"RXLP", 3, 2, 0, 0, fingerprint, key_digest(key),
                     len(payload), xxhash.xxh3_64_intdigest(payload)) + payload
    assert codec.verify(v3, key) == (None, "version")
    assert codec.stats()["version"] == 3
    store.put({"v3/_/" + "ab" * 32 + "/kv": v3})
    assert store.exists([key]) == [False]


def _as_format_2(blob: bytes, key: str) -> bytes:
    """The page as format 2 sealed it: HMAC-SHA256 under the v2 per-namespace key, over a v2
    header (reserved byte 0, an xxh3 checksum) and the payload; same layout and key digest."""
    payload = blob[HEADER_BYTES:-TAG_BYTES]
    namespace = key.split("/")[1].encode()
    mac_key = hmac.digest(SECRET.encode(), b"radixlink page mac v2\x00" + namespace, "sha256")
    header = struct.pack("<4sBBBB16s16sQQ", b"RXLP", 2, 2, 1, 0, blob[8:24], blob[24:40],
                         len(payload), xxhash.xxh3_64_intdigest(payload))
    return header + payload + hmac.digest(mac_key, header + payload, "sha256")


def test_sealed_pages_of_format_2_are_misses(sealed_url: str, link) -> None:
    """Flow: a tenant offloads to a sealed store; its pages are rewritten under the same keys
    exactly as format 2 sealed them (a valid HMAC-SHA256 tag under the old key derivation).
    The next load recomputes on 10 ``version`` misses: an old sealed page is never accepted."""
    owner = make_cache(namespace=MODEL)
    offload(owner, link(owner, open_store(sealed_url)))
    plain = open_store(sealed_url.split("?")[0])
    keys = _keys(plain)
    plain.put({key: _as_format_2(blob or b"", key)
               for key, blob in zip(keys, plain.get(keys), strict=True)})
    victim = make_cache(namespace=MODEL)
    _expect_recompute(victim, link(victim, open_store(sealed_url)), "version")


def test_a_mac_algorithm_downgrade_is_a_miss(sealed_url: str, link) -> None:
    """Flow: pages sealed with ``mac=hmac-sha256`` (asked for by name) load through a linker
    on the same URL; a linker with the same secret on the default MAC (keyed BLAKE3) treats
    them as ``auth`` misses, and so does an HMAC linker reading BLAKE3 pages."""
    hmac_url = f"{sealed_url}&mac=hmac-sha256"
    owner = make_cache(namespace=MODEL)
    offload(owner, link(owner, open_store(hmac_url)))
    reader = make_cache(namespace=MODEL)
    result = request(reader, link(reader, open_store(hmac_url)), TOKENS, "r", namespace=None)
    assert (result["hit"], result["ok"], result["prefix"]) == (40, True, 40)
    blake3_reader = make_cache(namespace=MODEL)
    _expect_recompute(blake3_reader, link(blake3_reader, open_store(sealed_url)), "auth")
    plain = open_store(sealed_url.split("?")[0])
    plain.clear("")
    owner = make_cache(namespace=MODEL)
    offload(owner, link(owner, open_store(sealed_url)))
    hmac_reader = make_cache(namespace=MODEL)
    _expect_recompute(hmac_reader, link(hmac_reader, open_store(hmac_url)), "auth")
