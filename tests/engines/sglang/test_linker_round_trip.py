"""RadixlinkLinker inside SGLang's UnifiedRadixCache: two nodes sharing one store.

Flow of each test: node A serves a prompt and its tree offloads it through the linker; node B,
given the same prompt, misses on device, finds the store hit, loads it layer by layer, and its
pool then holds byte-identical KV for those tokens.
"""

from __future__ import annotations

import pytest

from .conftest import SGLANG_MISSING

pytest.importorskip("sglang", reason=SGLANG_MISSING)

import torch  # noqa: E402

from .harness import FULL, FULL_MAMBA, FULL_SWA, Node  # noqa: E402

PROMPT = list(range(1000, 1042))  # 10 whole pages of 4 and a partial page


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.fixture
def pair(store_url: str):
    made: list[Node] = []

    def make(shape):
        a, b = Node(shape, store_url, seed=1), Node(shape, store_url, seed=2)
        made.extend((a, b))
        return a, b

    yield make
    for node in made:
        node.close()


def test_full_round_trip_is_byte_identical(pair) -> None:
    """FULL: B restores every whole page A served, byte for byte, on every layer."""
    a, b = pair(FULL)
    a_slots = a.serve(PROMPT)
    got = b.restore(PROMPT, "r1")
    whole = len(PROMPT) // 4 * 4
    assert (got.device_len, got.loaded_len, got.failed) == (0, whole, False)
    assert _equal(b.full_bytes(got.slots), a.full_bytes(a_slots[:whole]))


def test_swa_round_trip_restores_full_and_window(pair) -> None:
    """FULL+SWA: B restores the full KV of every page and the SWA window before the end."""
    a, b = pair(FULL_SWA)
    a_slots = a.serve(PROMPT)
    got = b.restore(PROMPT, "r1")
    whole = len(PROMPT) // 4 * 4
    assert (got.loaded_len, got.failed) == (whole, False)
    assert _equal(b.full_bytes(got.slots), a.full_bytes(a_slots[:whole]))
    window = FULL_SWA.window
    assert _equal(b.swa_bytes(got.slots[-window:]), a.swa_bytes(a_slots[whole - window : whole]))


def test_mamba_round_trip_restores_kv_and_state(pair) -> None:
    """FULL+MAMBA: B restores the KV and the recurrent state at the node's end."""
    a, b = pair(FULL_MAMBA)
    a_slots = a.serve(PROMPT)
    got = b.restore(PROMPT, "r1")
    whole = len(PROMPT) // 4 * 4
    assert (got.loaded_len, got.failed) == (whole, False)
    assert _equal(b.full_bytes(got.slots), a.full_bytes(a_slots[:whole]))
    assert _equal(b.state_bytes(got.request.kv.mamba_pool_idx.reshape(1)),
                  a.state_bytes(a.state_slot))


def test_a_path_loaded_from_the_store_is_not_written_back(pair) -> None:
    """SGLang offloads a path it loaded from the store again once the request ends (it never
    marks it stored): the linker asks the store and sends nothing it holds, and sends only
    the new pages of a longer prompt over that path."""
    a, b = pair(FULL)
    a.serve(PROMPT)
    got = b.restore(PROMPT, "r1")
    assert (got.loaded_len, got.failed) == (len(PROMPT) // 4 * 4, False)
    b.serve(PROMPT)  # NOTE: the request's insert over the loaded path, as the scheduler's
    stats = b.linker.stats()
    assert (stats["offload_jobs"], stats["saved_pages"]) == (1, 0)
    assert stats["skipped_pages"] == len(PROMPT) // 4
    longer = PROMPT + list(range(2000, 2008))
    b.serve(longer)
    stats = b.linker.stats()
    assert stats["saved_pages"] == len(longer) // 4 - len(PROMPT) // 4
