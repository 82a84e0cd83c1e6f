"""Isolation: identical tokens under different namespaces never match, on device or through a
store, in one process or across processes; store keys hold only hashes; oversized payloads
are rejected before any allocation; Redis credentials and TLS options pass through the URL."""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import textwrap
import tracemalloc

import pytest
import torch

from radixlink.hashing import Namespace
from radixlink.stores.codec import HEADER_BYTES
from radixlink.stores.directory import DirectoryStore
from radixlink.stores.memory import MemoryStore

from .kit import (
    LAYOUT,
    TOKENS,
    assert_exact,
    kv_codec,
    make_cache,
    offload,
    request,
    run_child,
    serve,
)

BASE = Namespace(model="tiny-hybrid@1", layout=LAYOUT.fingerprint(), cache_salt="salt-a",
                 extra_key="lora-1")
VARIANTS = {f.name: dataclasses.replace(BASE, **{f.name: getattr(BASE, f.name) + "'"})
            for f in dataclasses.fields(Namespace)}
REQUEST_NS = Namespace(model="tiny-hybrid@1", cache_salt="tenant-7")
KEY_RE = re.compile(r"^v4/[0-9a-f]{16}/[0-9a-f]{64}/kv(/r\d+)?$")
FILE_RE = re.compile(r"^v4%2F[0-9a-f]{16}%2F[0-9a-f]{64}%2Fkv(%2Fr\d+)?$")  # the same, escaped


def test_one_cache_keeps_identical_tokens_of_each_namespace_apart() -> None:
    """The same 40 tokens inserted under five request namespaces (BASE and one variant per
    field): five disjoint cached copies, each holding its own namespace's K/V, each matched
    only under its own namespace (and never under the cache's default)."""
    cache = make_cache(num_tokens=512)
    namespaces = [BASE, *VARIANTS.values()]
    for ns in namespaces:
        assert serve(cache, TOKENS, ns) == 0  # no other namespace's pages match
    slots = [cache.match_prefix(TOKENS, namespace=ns).device_indices for ns in namespaces]
    assert all(s.numel() == 40 for s in slots)
    assert torch.unique(torch.cat(slots)).numel() == 40 * len(namespaces)
    assert cache.match_prefix(TOKENS).prefix_len == 0
    assert cache.match_prefix(TOKENS, namespace=REQUEST_NS).prefix_len == 0
    assert_exact(cache)  # verify_tree: every root's pages carry their own namespace's K/V


@pytest.mark.parametrize("field", sorted(VARIANTS))
def test_a_store_never_serves_another_namespaces_pages(store, link, field) -> None:
    """A cache in namespace BASE offloads; a cache differing in one field (model, layout,
    cache_salt or extra_key) finds nothing in the same store; a BASE cache loads them."""
    cache_a = make_cache(namespace=BASE)
    offload(cache_a, link(cache_a, store))
    other = make_cache(namespace=VARIANTS[field])
    assert request(other, link(other, store), TOKENS, "x")["hit"] == 0
    same = make_cache(namespace=BASE)
    result = request(same, link(same, store), TOKENS, "y")
    assert result["ok"] and result["prefix"] == 40
    assert_exact(other)
    assert_exact(same)


def test_per_request_namespace_isolates_through_the_store(store, link) -> None:
    """Per-request namespaces (match_prefix / InsertParams namespace=) layer on the cache's:
    pages offloaded under REQUEST_NS by a BASE cache load only for requests that pass
    REQUEST_NS on a BASE cache."""
    cache_a = make_cache(namespace=BASE)
    offload(cache_a, link(cache_a, store), namespace=REQUEST_NS)
    cache_b = make_cache(namespace=BASE)
    linker_b = link(cache_b, store)
    assert request(cache_b, linker_b, TOKENS, "plain")["hit"] == 0
    tenant = dataclasses.replace(REQUEST_NS, cache_salt="tenant-8")
    assert request(cache_b, linker_b, TOKENS, "tenant8", namespace=tenant)["hit"] == 0
    result = request(cache_b, linker_b, TOKENS, "tenant7", namespace=REQUEST_NS)
    assert result["ok"] and result["prefix"] == 40
    assert linker_b.flush(timeout=30)
    assert_exact(cache_b)


WRITER = textwrap.dedent("""
    import json, sys
    import faults.kit as kit
    from radixlink.hashing import Namespace
    from radixlink.linker.core import ExternalCacheLinker
    from radixlink.stores.directory import DirectoryStore

    cache = kit.make_cache(namespace=Namespace(**json.loads(sys.argv[2])))
    linker = ExternalCacheLinker(cache, DirectoryStore(sys.argv[1]))
    kit.offload(cache, linker)
    kit.offload(cache, linker, namespace=Namespace(**json.loads(sys.argv[3])))
    linker.close()
    kit.assert_exact(cache)
    print("ok")
""")


def test_isolation_holds_across_processes_sharing_a_directory(tmp_path, link) -> None:
    """Another process writes the same tokens under BASE (cache namespace) and REQUEST_NS
    (request namespace) into a shared directory: here, caches differing in any namespace field
    find nothing; BASE and REQUEST_NS requests load their own K/V byte-identical."""
    proc = run_child(WRITER, str(tmp_path), json.dumps(dataclasses.asdict(BASE)),
                     json.dumps(dataclasses.asdict(REQUEST_NS)))
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    store = DirectoryStore(tmp_path)
    for ns in VARIANTS.values():
        other = make_cache(namespace=ns)
        assert request(other, link(other, store), TOKENS, "x")["hit"] == 0
        assert_exact(other)
    same = make_cache(namespace=BASE)
    linker = link(same, store)
    assert request(same, linker, TOKENS, "base")["ok"]
    assert request(same, linker, TOKENS, "req", namespace=REQUEST_NS)["ok"]
    assert linker.flush(timeout=30)
    assert_exact(same)


def test_store_keys_hold_only_hashes(tmp_path, link) -> None:
    """Every key a linker writes (memory keys, directory file names) is version / namespace
    id / sha256 hex / pool: no token id appears in any form."""
    tokens = [987654321 + 7 * i for i in range(40)]
    tenant_tokens = [123456789 + 11 * i for i in range(40)]
    memory, directory = MemoryStore(), DirectoryStore(tmp_path)
    for store in (memory, directory):
        cache = make_cache(namespace=Namespace(model=REQUEST_NS.model))
        linker = link(cache, store)
        offload(cache, linker, tokens)
        offload(cache, linker, tenant_tokens, namespace=REQUEST_NS)
        keys = [key for key, _ in store.scan()]
        assert len(keys) == 20 and all(KEY_RE.match(key) for key in keys), keys
        names = " ".join(keys)
        for tok in tokens + tenant_tokens:
            for form in (str(tok), f"{tok:x}", struct.pack("<I", tok).hex()):
                assert form not in names, (tok, form)
    files = [p.name for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == 20 and all(FILE_RE.match(f) for f in files)


def test_oversized_payload_is_rejected_before_allocation(link) -> None:
    """A payload larger than the layout's page: encode refuses it; a stored value whose header
    claims a huge length is a counted "length" miss found from the header alone (no copy of a
    16 MiB body); loading it fails and frees every reserved slot."""
    codec = kv_codec()
    with pytest.raises(ValueError, match="page payload is 1025 bytes"):
        codec.encode(b"x" * (LAYOUT.page_bytes + 1), "v2/_/00/kv")
    store = MemoryStore(capacity_bytes=1 << 30)  # ten references to one 16 MiB value
    cache_a = make_cache()
    offload(cache_a, link(cache_a, store))
    keys = [key for key, _ in store.scan()]
    blob = store.get(keys[:1])[0]
    huge = bytearray(blob[:HEADER_BYTES]) + bytes(16 << 20)
    huge[40:48] = struct.pack("<Q", len(huge) - HEADER_BYTES)  # the payload length field
    huge = bytes(huge)
    tracemalloc.start()
    try:
        assert codec.decode(huge, keys[0]) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 10 and codec.stats()["length"] == 1
    store.put(dict.fromkeys(keys, huge))
    cache_b = make_cache()
    linker_b = link(cache_b, store)
    tracemalloc.start()
    try:
        result = request(cache_b, linker_b, TOKENS, "r")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    misses = linker_b.stats()["codec_misses"]  # the value names keys[0]: 9 pages are "key"
    assert result["ok"] is False and (misses["length"], misses["key"]) == (1, 9), misses
    assert peak < 4 << 20, peak
    assert linker_b.flush(timeout=30)
    assert_exact(cache_b)


def test_two_models_and_two_tenants_on_one_store_never_share_a_page(store, link) -> None:
    """#14.2: request namespaces layer on the cache's (they used to replace it: model 2 found
    model 1's pages when both passed Namespace(cache_salt="user-42")). Every (model, tenant)
    pair writes the same tokens: four disjoint sets of keys; each reader finds exactly its own
    pair's pages, byte-identical; a request naming another model is refused."""
    models = [Namespace(model="model-1"), Namespace(model="model-2")]
    tenants = [Namespace(cache_salt="user-42"), Namespace(cache_salt="user-43")]
    written: list[set[str]] = []
    for model in models:
        for tenant in tenants:
            before = {key for key, _ in store.scan()}
            cache = make_cache(namespace=model)
            offload(cache, link(cache, store), namespace=tenant)
            written.append({key for key, _ in store.scan()} - before)
    assert all(len(keys) == 10 for keys in written)
    assert len(set().union(*written)) == 40  # no pair shares a page
    for model in models:
        for tenant in tenants:
            reader = make_cache(namespace=model)
            result = request(reader, link(reader, store), TOKENS, "r", namespace=tenant)
            assert result["ok"] and result["prefix"] == 40  # kit checks the pair's own K/V
            assert_exact(reader)
    other = make_cache(namespace=models[0])
    with pytest.raises(ValueError, match="cannot change its model"):
        other.match_prefix(TOKENS, namespace=Namespace(model="model-2", cache_salt="user-42"))
