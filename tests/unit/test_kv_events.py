"""radixlink.kvevents: the queue producers append to, and vLLM's events read into the same
records (what radixlink's router reads from vLLM's stream)."""

from __future__ import annotations

import pytest

from radixlink.kvevents import (
    MEDIUM_GPU,
    MEDIUM_STORAGE,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventKind,
    KVEventQueue,
    Tier,
    as_kv_event,
    hash_hex,
)


def test_event_queue_drains_in_order_and_counts_drops() -> None:
    """Events drain oldest first; past the bound the oldest are dropped and counted."""
    queue = KVEventQueue(max_events=3, node_id="n0")
    for i in range(5):
        queue.emit(KVEventKind.STORED, Tier.DEVICE, [f"h{i}"])
    queue.emit(KVEventKind.REMOVED, Tier.STORE, [])  # no pages: no event
    assert queue.stats() == {"emitted": 5, "dropped": 2, "pending": 3}
    first = queue.drain(1)
    assert [e.block_hashes for e in first] == [("h2",)] and first[0].node_id == "n0"
    assert [e.block_hashes for e in queue.drain()] == [("h3",), ("h4",)]
    assert queue.drain() == []


def test_event_without_hashes_names_the_tree_node() -> None:
    """An event with no page hashes is kept when it names a tree node and token range."""
    queue = KVEventQueue()
    queue.emit("stored", "device", [], tree_node_id=7, token_range=(0, 8))
    (event,) = queue.drain()
    assert isinstance(event, BlockStored) and event.medium == MEDIUM_GPU
    assert event.tree_node_id == 7 and event.token_range == (0, 8)


@pytest.mark.parametrize(("tier", "medium"), [("device", "GPU"), ("host", "CPU"),
                                              ("store", "STORAGE")])
def test_tiers_are_vllm_mediums(tier: str, medium: str) -> None:
    """radixlink's tier words map to vLLM's medium words; removals are BlockRemoved."""
    queue = KVEventQueue(node_id="n")
    queue.emit("removed", tier, ["ab"])
    (event,) = queue.drain()
    assert isinstance(event, BlockRemoved) and event.medium == medium


def test_vllm_wire_events_read_into_records() -> None:
    """vLLM's events as its ZMQ stream carries them (msgpack maps with a "type"): bytes and
    int hashes become hex, the node id is stamped, unknown types are None."""
    stored = as_kv_event({"type": "BlockStored", "block_hashes": [b"\x01\xff", 7],
                          "parent_block_hash": b"\x00", "token_ids": [5, 6], "block_size": 1,
                          "medium": "STORAGE", "lora_name": None, "locality": "REMOTE",
                          "ownership": "radixlink", "group_idx": 0, "session_id": "s"}, "n1")
    assert stored == BlockStored(block_hashes=("01ff", "0000000000000007"),
                                 parent_block_hash="00", token_ids=(5, 6), block_size=1,
                                 medium=MEDIUM_STORAGE, locality="REMOTE",
                                 ownership="radixlink", group_idx=0, node_id="n1")
    removed = as_kv_event({"type": "BlockRemoved", "block_hashes": ["ab"], "medium": None})
    assert removed == BlockRemoved(block_hashes=("ab",), medium=MEDIUM_GPU)
    assert as_kv_event({"type": "AllBlocksCleared"}, "n2") == AllBlocksCleared(node_id="n2")
    assert as_kv_event({"type": "Future"}) is None
    assert as_kv_event(stored) is stored


def test_a_bad_block_hash_is_a_value_error() -> None:
    """A hash that is neither bytes, int nor str is named in the error."""
    with pytest.raises(ValueError, match="float 1.5"):
        hash_hex(1.5)
    with pytest.raises(ValueError, match="bytes, int or a hex string"):
        as_kv_event({"type": "BlockRemoved", "block_hashes": [None]})
