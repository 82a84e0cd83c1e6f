"""RadixlinkLinker failure behaviour inside SGLang's UnifiedRadixCache.

Missing pages shorten the restore to the longest legal length at lookup. A corrupt page fails
its load batch (SGLang aborts exactly the requests loading in it), and the linker deletes
the page (it reads absent until written again) so the retry restores the longest legal
shorter prefix. A failing store fails only the loading request; every reserved slot is free
again afterwards.
"""

from __future__ import annotations

import pytest

from .conftest import SGLANG_MISSING

pytest.importorskip("sglang", reason=SGLANG_MISSING)

import torch  # noqa: E402

from radixlink.integrations.sglang.hashing_compat import sglang_storage_page_hashes  # noqa: E402
from radixlink.stores.registry import open_store  # noqa: E402

from .conftest import faults_url  # noqa: E402
from .harness import FULL, FULL_SWA  # noqa: E402

PROMPT = list(range(2000, 2040))  # 10 pages of 4
PAGE = 4


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _page_keys(url: str, page: int, pool: str) -> list[str]:
    """The store keys of page ``page`` of ``PROMPT`` in ``pool`` (SGLang's hash is in the key)."""
    page_hash = sglang_storage_page_hashes(PROMPT, PAGE)[page]
    with open_store(url) as store:
        return [k for k, _ in store.scan() if f"/{page_hash}/{pool}" in k]


@pytest.mark.parametrize("shape", [FULL, FULL_SWA], ids=["full", "full_swa"])
def test_missing_page_restores_longest_legal_prefix(store_url, nodes, shape) -> None:
    """With page 6 gone from the store, B restores pages 0..5 (its window too), identically."""
    a, b = nodes(shape, store_url, 1), nodes(shape, store_url, 2)
    a_slots = a.serve(PROMPT)
    with open_store(store_url) as store:
        assert store.delete(_page_keys(store_url, 6, "kv")) == 1
    got = b.restore(PROMPT, "r1")
    assert (got.loaded_len, got.failed) == (6 * PAGE, False)
    assert _equal(b.full_bytes(got.slots), a.full_bytes(a_slots[: 6 * PAGE]))
    if shape is FULL_SWA:
        w = shape.window
        assert _equal(b.swa_bytes(got.slots[-w:]), a.swa_bytes(a_slots[6 * PAGE - w : 6 * PAGE]))


def test_missing_window_page_makes_interior_lengths_illegal(file_url, nodes) -> None:
    """FULL+SWA with the SWA page 8 missing: lengths 9 and 10 lack their window, so B restores
    8 pages (the longest legal), not 10."""
    a, b = nodes(FULL_SWA, file_url, 1), nodes(FULL_SWA, file_url, 2)
    a.serve(PROMPT)
    with open_store(file_url) as store:
        assert store.delete(_page_keys(file_url, 8, "swa")) == 1
    got = b.restore(PROMPT, "r1")
    assert (got.loaded_len, got.failed) == (8 * PAGE, False)


def test_corrupt_page_fails_the_load_then_restores_shorter(store_url, nodes) -> None:
    """A flipped byte in page 6: the first load fails (its request is aborted, its slots freed
    by the scheduler), the retry restores pages 0..5 byte-identically."""
    a, b = nodes(FULL, store_url, 1), nodes(FULL, store_url, 2)
    a_slots = a.serve(PROMPT)
    with open_store(store_url) as store:
        (victim,) = _page_keys(store_url, 6, "kv")
        blob = bytearray(store.get([victim])[0])
        blob[len(blob) // 2] ^= 0x01
        store.put({victim: bytes(blob)})
    free_before = b.allocator.available_size()
    first = b.restore(PROMPT, "r1")
    assert (first.loaded_len, first.failed) == (10 * PAGE, True)
    b.release(first)
    assert b.allocator.available_size() == free_before
    second = b.restore(PROMPT, "r2")
    assert (second.loaded_len, second.failed) == (6 * PAGE, False)
    assert _equal(b.full_bytes(second.slots), a.full_bytes(a_slots[: 6 * PAGE]))


def test_failing_store_fails_only_the_loading_request(file_url, nodes) -> None:
    """B's store fails every read: the loading request fails, a request of the same batch that
    hit on device does not, no slot leaks, and once the store recovers B restores fully."""
    a = nodes(FULL, file_url, 1)
    a_slots = a.serve(PROMPT)
    b = nodes(FULL, faults_url(file_url, fail=1, ops="get"), 2)
    local = list(range(5000, 5016))
    b.serve(local)
    free_before = b.allocator.available_size()
    loading, device_hit = b.admit(PROMPT, "load"), b.admit(local, "local")
    assert (loading.loaded_len, device_hit.device_len) == (10 * PAGE, 16)
    b.run_batch([loading, device_hit])
    assert (loading.failed, device_hit.failed) == (True, False)
    b.release(loading)
    assert b.allocator.available_size() == free_before
    b.linker.store.fail = 0.0  # the store recovers
    again = b.restore(PROMPT, "load-2")
    assert (again.loaded_len, again.failed) == (10 * PAGE, False)
    assert _equal(b.full_bytes(again.slots), a.full_bytes(a_slots))


def test_unreachable_store_at_lookup_is_a_miss(file_url, nodes) -> None:
    """A store failing presence checks makes the lookup restore nothing (recompute), never an
    exception into the scheduler."""
    a = nodes(FULL, file_url, 1)
    a.serve(PROMPT)
    b = nodes(FULL, faults_url(file_url, fail=0, ops="exists"), 2)
    b.linker.store.fail = 1.0  # NOTE: after startup, whose probe would refuse this store
    got = b.restore(PROMPT, "r1")
    assert (got.device_len, got.loaded_len, got.failed) == (0, 0, False)
