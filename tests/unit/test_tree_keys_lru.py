"""Tree keys (packing, page-aligned common prefix) and the evictable set (LRU / LFU order)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixlink.config import EvictionPolicy
from radixlink.tokens import token_bytes
from radixlink.tree.keys import KeyPacker, common_prefix_bytes, key_tokens
from radixlink.tree.lru import EvictableSet
from radixlink.tree.node import TreeNode


@pytest.mark.parametrize(
    "tokens",
    [
        [1, 2, 70000, 2**32 - 1],
        np.array([1, 2, 70000, 2**32 - 1], dtype=np.int64),
        np.array([1, 2, 70000, 2**32 - 1], dtype=np.uint32),
        torch.tensor([1, 2, 70000, 2**32 - 1], dtype=torch.int64),
        (1, 2, 70000, 2**32 - 1),
        range(1, 3),
    ],
)
def test_token_bytes_accepts_lists_arrays_tensors(tokens: object) -> None:
    """Every accepted container packs to the same uint32 little-endian bytes."""
    packed = token_bytes(tokens)
    expected = list(tokens) if not hasattr(tokens, "tolist") else tokens.tolist()
    assert key_tokens(packed).tolist() == expected
    assert packed[:4] == (1).to_bytes(4, "little")


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ([1, -3], "-3"),
        ([1, 2**32], str(2**32)),
        ([1, 2.5], "2.5"),
        ([True, 1], "bool"),
        (np.array([[1, 2]]), "1-D"),
        (np.array([1.0, 2.0]), "integer dtype"),
        (np.array([4, -1]), "-1"),
        (torch.tensor([1.0]), "integer tensor"),
        ("abc", "str"),
        (b"abc", "bytes"),
        (5, "int"),
    ],
)
def test_token_bytes_rejects_bad_tokens_naming_the_value(tokens: object, message: str) -> None:
    """Bad tokens raise ValueError that names the offending value or type."""
    with pytest.raises(ValueError, match=message):
        token_bytes(tokens)


@pytest.mark.parametrize(
    ("a", "b", "page_size", "expected_tokens"),
    [
        ([1, 2, 3, 4], [1, 2, 3, 4, 5], 2, 4),
        ([1, 2, 3, 4], [1, 2, 3, 9], 2, 2),
        ([1, 2, 3, 4], [1, 9, 3, 4], 2, 0),
        ([1, 2, 3, 4], [1, 2, 3], 1, 3),
        ([1, 2, 3, 4], [1, 2, 3], 2, 2),
        ([7] * 33, [7] * 32 + [8], 16, 32),
        ([256, 1], [1, 1], 1, 0),
    ],
)
def test_common_prefix_is_page_aligned(
    a: list[int], b: list[int], page_size: int, expected_tokens: int
) -> None:
    """The common prefix stops at the first differing page, counted in whole pages."""
    got = common_prefix_bytes(token_bytes(a), token_bytes(b), 0, page_size * 4)
    assert got == expected_tokens * 4


def test_common_prefix_with_offset() -> None:
    """The key side is compared from the given byte offset."""
    key = token_bytes([9, 9, 1, 2, 3, 5])
    assert common_prefix_bytes(token_bytes([1, 2, 3, 4]), key, 8, 4) == 12


def _node(node_id: int, last_access: int, hit_count: int = 0) -> TreeNode:
    node = TreeNode(node_id, b"\0\0\0\0", None, 1)
    node.last_access, node.hit_count = last_access, hit_count
    return node


def test_lru_pops_least_recent_first_and_rekeys_lazily() -> None:
    """Scenario: a(1) b(2) c(3) join; a is touched (4); pops give b, c, a, then None."""
    lru = EvictableSet(0, EvictionPolicy.LRU)
    a, b, c = _node(1, 1), _node(2, 2), _node(3, 3)
    for node in (a, b, c):
        lru.add(node)
    a.last_access = 4
    assert len(lru) == 3 and a in lru
    assert [lru.pop(), lru.pop(), lru.pop(), lru.pop()] == [b, c, a, None]
    assert len(lru) == 0


def test_lru_discard_and_readd() -> None:
    """A discarded node is never popped; adding it again makes it a member once."""
    lru = EvictableSet(0, "lru")
    a, b = _node(1, 1), _node(2, 2)
    lru.add(a)
    lru.add(b)
    lru.discard(a)
    lru.discard(a)
    assert a not in lru and len(lru) == 1
    lru.add(a)
    lru.add(a)
    lru.check()
    assert len(lru) == 2 and lru.pop() is a and lru.pop() is b


def test_lfu_orders_by_hits_then_recency() -> None:
    """LFU pops the fewest hits first, ties broken by least recent access."""
    lfu = EvictableSet(0, EvictionPolicy.LFU)
    hot, cold_old, cold_new = _node(1, 1, hit_count=5), _node(2, 2), _node(3, 3)
    for node in (hot, cold_new, cold_old):
        lfu.add(node)
    cold_old.hit_count = 1  # a hit after joining: re-keyed when it surfaces
    assert [lfu.pop(), lfu.pop(), lfu.pop()] == [cold_new, cold_old, hot]


def test_evictable_set_compacts_stale_entries() -> None:
    """Many add/discard cycles keep the heap bounded and the membership exact."""
    lru = EvictableSet(0)
    nodes = [_node(i, i) for i in range(10)]
    for _ in range(200):
        for node in nodes:
            lru.add(node)
        for node in nodes[:9]:
            lru.discard(node)
    lru.check()
    assert len(lru) == 1 and lru.heap_size <= 2 * len(nodes) + 65
    assert lru.members() == [nodes[9]]


def test_key_packer_reuses_the_matched_prefix_only_when_it_is_one() -> None:
    """pack_extension equals token_bytes for extensions, other lists and in-place edits."""
    packer = KeyPacker()
    prompt = [1000 + i for i in range(40)]
    packer.pack(prompt)
    extended = prompt + [5, 6, 7]
    assert packer.pack_extension(extended) == token_bytes(extended)
    assert packer.pack_extension([9] + extended[1:]) == token_bytes([9] + extended[1:])
    assert packer.pack_extension(prompt[:10]) == token_bytes(prompt[:10])
    assert packer.pack_extension(np.array(extended)) == token_bytes(extended)
    prompt[-1] = 77  # edited in place after its match
    assert packer.pack_extension(prompt + [1]) == token_bytes(prompt + [1])
    prompt.append(3)  # grown in place: the head no longer has the matched length
    assert packer.pack_extension(prompt) == token_bytes(prompt)


def test_key_packer_sees_an_edit_in_the_middle_of_the_matched_list() -> None:
    """A token replaced inside the matched list (its length and end elements unchanged) must
    not reuse the bytes packed before the edit: the key would name tokens the caller's KV was
    not computed for."""
    packer = KeyPacker()
    prompt = [1000 + i for i in range(40)]
    packer.pack(prompt)
    prompt[20] = 7  # edited in place between match and insert
    extended = prompt + [5, 6]
    assert packer.pack_extension(extended) == token_bytes(extended)
