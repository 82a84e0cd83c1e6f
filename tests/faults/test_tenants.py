"""Two tenants sharing one directory store (issue 44), each with its own secret (``auth=``) and
its own namespace. The attacker can write the directory, so it can delete or overwrite the
victim's page files, but it cannot seal a page under the victim's MAC key. Whatever it puts
there, the victim never loads it: every damaged page is one counted miss of its reason, the
request that finds it recomputes its tail once, the recompute's offload rewrites the damaged
files (and no page outside that tail), and the next request loads all of it again.
The attacker's own pages stay intact. Threat model: docs/stores.md, "Tenants sharing a store".

    victim pages   0 1 [2] 3 4 5 6 [7] 8 9      [ ] = the attacker's work (both kinds of K/V
    attacker pages 0 1  2  3 4 5 6  7  8 9            differ: the oracle seeds them by tenant)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from radixlink.contract import PoolName
from radixlink.hashing import Namespace, namespace_id, page_hashes
from radixlink.stores import open_store, page_key
from radixlink.stores.codec import HEADER_BYTES, PageCodec, key_digest
from radixlink.stores.directory import DirectoryStore

from .kit import LAYOUT, PS, TOKENS, assert_exact, make_cache, offload, request

VICTIM = Namespace(model="tiny@1", layout=LAYOUT.fingerprint(), cache_salt="victim")
ATTACKER = Namespace(model="tiny@1", layout=LAYOUT.fingerprint(), cache_salt="attacker")
DAMAGED = (2, 7)
DIGEST = slice(24, 40)  # the key digest in the page header (docs/stores.md, page format)
REASONS = {"garbage": "bad_magic", "attacker_page": "key", "attacker_page_rekeyed": "auth",
           "unsealed_forgery": "auth"}


def _keys(cache: Any) -> list[str]:
    ns = cache.config.namespace
    return [page_key(namespace_id(ns), h, PoolName.KV, rank=0)
            for h in page_hashes(TOKENS, PS, ns, algo=cache.config.hash_algo)]


def _url(root: Path, secret: Path) -> str:
    return f"file://{root}?auth=file:{secret}"


def _attack(kind: str, files: DirectoryStore, victim: list[str], attacker: list[str]) -> None:
    """What a writer of the directory without the victim's secret does to pages ``DAMAGED``:
    plain file operations, as another process of another user would."""
    for i in DAMAGED:
        path = Path(files.path_of(victim[i]))
        theirs = Path(files.path_of(attacker[i])).read_bytes()  # its own sealed page i
        if kind == "deleted":
            path.unlink()
            continue
        if kind == "garbage":
            forged = os.urandom(len(theirs))
        elif kind == "attacker_page":
            forged = theirs
        elif kind == "attacker_page_rekeyed":  # the victim's key digest, its own tag
            forged = theirs[: DIGEST.start] + key_digest(victim[i]) + theirs[DIGEST.stop :]
        else:  # unsealed_forgery: its K/V, a valid header and checksum for the victim's key
            payload = theirs[HEADER_BYTES : HEADER_BYTES + LAYOUT.page_bytes]
            forged = bytes(PageCodec(LAYOUT.fingerprint(PoolName.KV), LAYOUT.page_bytes)
                           .encode(payload, victim[i]))
        path.write_bytes(forged)


@pytest.mark.parametrize("kind", ["deleted", *REASONS])
def test_an_attacker_without_the_secret_costs_one_bounded_recompute(kind: str, link,
                                                                     tmp_path: Path) -> None:
    """Flow: victim and attacker offload TOKENS (each in its namespace, sealed with its own
    secret) to one directory; the attacker damages victim pages 2 and 7 (``kind``). A fresh
    victim cache serves TOKENS: deleted pages make the lookup stop at page 2 (8 tokens load,
    32 recompute); overwritten ones make the load fail with exactly 2 misses of their reason
    (40 recompute, the load is all or nothing). Either way nothing of the attacker's enters
    its tree, the recompute's offload rewrites the 2 damaged files (and no file before the
    recomputed tail), and a third victim cache loads all 40 tokens; the attacker still loads
    its own."""
    root = tmp_path / "store"
    secrets = {}
    for name in ("victim", "attacker"):
        secrets[name] = tmp_path / f"{name}.key"
        secrets[name].write_bytes(os.urandom(32))
    victim_url, attacker_url = _url(root, secrets["victim"]), _url(root, secrets["attacker"])
    first = make_cache(namespace=VICTIM)
    offload(first, link(first, victim_url))
    attacker = make_cache(namespace=ATTACKER)
    offload(attacker, link(attacker, attacker_url))
    files = DirectoryStore(root)  # the attacker's view: paths only, no secret
    victim_keys, attacker_keys = _keys(first), _keys(attacker)
    assert set(victim_keys).isdisjoint(attacker_keys)
    assert all(Path(files.path_of(k)).is_file() for k in victim_keys + attacker_keys)
    kept = tmp_path / "kept"  # NOTE: a hard link per page keeps its inode from being reused
    kept.mkdir()
    for i, k in enumerate(victim_keys):
        os.link(files.path_of(k), kept / str(i))

    _attack(kind, files, victim_keys, attacker_keys)

    second = make_cache(namespace=VICTIM)
    linker = link(second, victim_url)
    got = request(second, linker, TOKENS, "after-attack")
    misses = linker.stats()["codec_misses"]
    if kind == "deleted":
        assert (got["hit"], got["ok"], got["prefix"]) == (8, True, 8), got
        assert misses["misses"] == 0, misses
    else:
        assert (got["hit"], got["ok"], got["prefix"]) == (40, False, 0), got
        assert misses[REASONS[kind]] == len(DAMAGED) and misses["misses"] == len(DAMAGED)
    assert_exact(second)  # no page of the attacker in the tree (its K/V differ)
    assert linker.flush(timeout=30)
    with open_store(victim_url) as store:
        assert all(store.exists(victim_keys))
    # bounded: the damaged files are rewritten, and nothing beyond the recomputed tail's pages
    # (the offload exports whole nodes: the tail's intact pages are written again too)
    rewritten = {k for i, k in enumerate(victim_keys)
                 if not os.path.samefile(files.path_of(k), kept / str(i))}
    recomputed = set(victim_keys[got["prefix"] // PS :])
    assert {victim_keys[i] for i in DAMAGED} <= rewritten <= recomputed, sorted(rewritten)

    third = make_cache(namespace=VICTIM)
    again = link(third, victim_url)
    got = request(third, again, TOKENS, "healed")
    assert (got["ok"], got["prefix"]) == (True, 40) and again.stats()["codec_misses"][
        "misses"] == 0, got
    assert_exact(third)
    theirs = make_cache(namespace=ATTACKER)
    got = request(theirs, link(theirs, attacker_url), TOKENS, "attacker")
    assert (got["ok"], got["prefix"]) == (True, 40), got
    assert_exact(theirs)
    files.close()


def test_a_persistent_attacker_costs_each_request_at_most_one_failed_load(link,
                                                                          tmp_path: Path) -> None:
    """Flow: the attacker rewrites victim pages 2 and 7 with its own pages before each of 5
    victim requests (a fresh cache each, as new engines would): every request is served
    exactly (never the attacker's K/V), pays one failed load with 2 counted misses and one
    recompute of 40 tokens, and heals the store for a request that comes before the next
    attack; it never retries or loops."""
    root = tmp_path / "store"
    victim_secret, attacker_secret = tmp_path / "victim.key", tmp_path / "attacker.key"
    victim_secret.write_bytes(os.urandom(32))
    attacker_secret.write_bytes(os.urandom(32))
    victim_url = _url(root, victim_secret)
    first = make_cache(namespace=VICTIM)
    offload(first, link(first, victim_url))
    attacker = make_cache(namespace=ATTACKER)
    offload(attacker, link(attacker, _url(root, attacker_secret)))
    files = DirectoryStore(root)
    victim_keys, attacker_keys = _keys(first), _keys(attacker)
    for round_ in range(5):
        _attack("attacker_page", files, victim_keys, attacker_keys)
        cache = make_cache(namespace=VICTIM)
        linker = link(cache, victim_url)
        got = request(cache, linker, TOKENS, f"victim{round_}")
        assert (got["hit"], got["ok"], got["prefix"]) == (40, False, 0), got
        stats = linker.stats()
        assert stats["failures_load"] == 1 and stats["codec_misses"]["key"] == len(DAMAGED)
        assert linker.flush(timeout=30)
        assert_exact(cache)
        clean = make_cache(namespace=VICTIM)
        got = request(clean, link(clean, victim_url), TOKENS, f"between{round_}")
        assert (got["ok"], got["prefix"]) == (True, 40), got
        assert_exact(clean)
    files.close()
