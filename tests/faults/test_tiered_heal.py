"""A tiered store heals its back (issue #24, item 2). Flow: a memory front over a shared
directory back; the one back write of an offload fails (ENOSPC), so only the front holds the
pages while the node is marked stored. On the next hit, revalidation asks the tiered store,
which answers for the back: the pages are missing there, the node is unmarked and written
again, the back then holds every page, and a peer (a second cache on the same back) loads the
whole prefix."""

from __future__ import annotations

from pathlib import Path

from radixlink.hashing import Namespace
from radixlink.linker.core import ExternalCacheLinker
from radixlink.stores.directory import DirectoryStore
from radixlink.stores.faults import FaultyStore
from radixlink.stores.memory import MemoryStore
from radixlink.stores.tiered import TieredStore

from .kit import TOKENS, assert_exact, make_cache, offload, request

NS = Namespace(model="test-model")
PAGES = len(TOKENS) // 4


def test_failed_back_write_is_rewritten_after_revalidation(tmp_path: Path) -> None:
    """One failed back write: after one revalidating hit the back holds all ten pages and a
    peer on the same back gets a full external hit."""
    back = FaultyStore(DirectoryStore(tmp_path / "back"), enospc=1.0, ops=("put",))
    tiered = TieredStore(MemoryStore(), back)
    cache = make_cache(namespace=NS)
    with ExternalCacheLinker(cache, tiered, revalidate_after_s=0) as linker:
        offload(cache, linker)
        tiered.flush()
        assert tiered.stats()["back_put_failures"] == PAGES
        assert not list(back.inner.scan()), "the back took nothing"
        back.enospc = 0.0  # the disk has room again
        assert request(cache, linker, TOKENS, "again")["prefix"] == len(TOKENS)
        assert linker.flush(timeout=30)
        tiered.flush()
        assert linker.stats()["lost_nodes"] == 1
        assert cache.match_prefix(TOKENS).last_node.external_cache_stored
    assert_exact(cache)
    tiered.close()
    with DirectoryStore(tmp_path / "back") as shared:
        assert len(list(shared.scan())) == PAGES, "the back healed"
    peer = make_cache(namespace=NS)
    peer_store = TieredStore(MemoryStore(), DirectoryStore(tmp_path / "back"))
    with ExternalCacheLinker(peer, peer_store) as peer_linker:
        got = request(peer, peer_linker, TOKENS, "peer")
    peer_store.close()
    assert got["hit"] == len(TOKENS) and got["ok"] is True
    assert_exact(peer)


def test_tiered_exists_counts_a_queued_back_write_as_present(tmp_path: Path) -> None:
    """A page whose back write is still queued is present (the front holds it and the back
    will); once the write failed it is absent although the front still holds it."""
    back = FaultyStore(DirectoryStore(tmp_path / "back"), enospc=1.0, ops=("put",),
                       delay_ms=200)
    with TieredStore(MemoryStore(), back) as tiered:
        assert tiered.put({"k": b"v"}) == [True]
        assert tiered.exists(["k"]) == [True], "queued for the back"
        tiered.flush()
        assert tiered.exists(["k"]) == [False], "the back never took it"
        assert tiered.get(["k"]) == [b"v"], "the front still serves it"
