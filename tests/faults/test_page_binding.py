"""Pages name their key and, with a secret, are sealed: a page copied under another tenant's key,
a batch a store returns in the wrong order, and a page forged by a writer without the secret
are counted misses. The request recomputes and is served only its own K/V (issue 14, item 1)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from radixlink.hashing import Namespace
from radixlink.stores import Store, open_store
from radixlink.stores.codec import HEADER_BYTES, TAG_BYTES

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
    checksum), once unsealed and once marked sealed with the real page's tag copied over.
    Both are ``auth`` misses; the tenant recomputes."""
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
    # marked sealed (flags byte), with the real page's tag appended
    marked = {
        key: blob[:6] + b"\x01" + blob[7:] + original[-TAG_BYTES:]  # type: ignore[index]
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
    """Keys carry the format version, so a page stored under a v1 key is not found by its v2
    key; a format-1 payload under a v2 key is a ``version`` miss."""
    key = "v2/_/" + "ab" * 32 + "/kv"
    old = b"RXLP\x01\x02\x00\x00" + bytes(32) + b"x" * 16
    codec = kv_codec()
    assert codec.decode(old, key) is None and codec.stats()["version"] == 1
    store.put({"v1/_/" + "ab" * 32 + "/kv": old})
    assert store.exists([key]) == [False]
