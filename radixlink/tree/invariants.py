"""Structural invariants of a ``RadixTree``, checked by a full walk (tests call it every step).

Owns no state. Component-specific rules are delegated to each component's check hooks.
"""

from __future__ import annotations

from radixlink.hashing import page_hashes
from radixlink.tree.keys import key_tokens
from radixlink.tree.node import TreeNode
from radixlink.tree.tree import RadixTree


def check_tree(tree: RadixTree) -> None:
    """Assert every structural rule of ``tree``; raises AssertionError naming the culprit.

    Checked: root shape; parent/child links and child dict keys; keys are non-empty whole
    pages; ``seq_len`` sums; hashes present exactly when hashing, one per page and chained;
    no leaf made only of tombstones; node count; live handles point at live nodes; then each
    component's per-node and component-wide rules (sizes, evictable set, lock counts).
    """
    pb = tree.page_bytes
    components = tree.components
    cached = [0] * len(components)
    count = 0
    for root in tree.roots():
        assert root.parent is None and root.key == b"" and root.seq_len == 0, f"bad root {root}"
        assert all(v is None for v in root.values), f"root {root} holds data"
        assert not any(root.lock_refs), f"root {root} has lock counts"
    for node in tree.iter_nodes():
        count += 1
        parent = node.parent
        assert parent is not None, f"{node} has no parent"
        key = node.key
        assert key and len(key) % pb == 0, f"{node}: key of {len(key)} bytes is not whole pages"
        assert parent.children.get(key[:pb]) is node, f"{node} is not under its first page"
        assert node.seq_len == parent.seq_len + node.num_tokens, f"{node}: seq_len mismatch"
        assert len(node.values) == len(components), f"{node}: wrong number of values"
        if node.children:
            for first, child in node.children.items():
                assert child.parent is node, f"{child} does not point back to {node}"
                assert child.key[:pb] == first, f"{child} filed under the wrong first page"
        else:
            assert any(v is not None for v in node.values) or any(node.lock_refs), (
                f"{node} is a leaf made only of tombstones"
            )
        _check_hashes(tree, node)
        for component in components:
            cached[component.index] += component.check_node(node)
    assert count == tree.num_nodes, f"tree counts {tree.num_nodes} nodes, walk found {count}"
    handles = tree.live_handles()
    for handle in handles:
        assert handle.node.seq_len >= 0, f"live {handle} points at a removed node"
        assert not handle.released, f"{handle} is released but still live"
    for component in components:
        component.check(cached[component.index], handles)


def _check_hashes(tree: RadixTree, node: TreeNode) -> None:
    if not tree.hashing:
        assert node.hash_value is None, f"{node} has hashes with hashing off"
        return
    pages = node.num_tokens // tree.page_size
    assert node.hash_value is not None and len(node.hash_value) == pages, (
        f"{node}: {0 if node.hash_value is None else len(node.hash_value)} hashes for {pages} pages"
    )
    parent = node.parent
    assert parent is not None
    chain = parent.hash_value[-1] if parent.hash_value else None
    namespace = None if chain is not None else parent.namespace
    expected = page_hashes(
        key_tokens(node.key), tree.page_size, namespace, parent=chain, algo=tree.hash_algo
    )
    assert node.hash_value == expected, f"{node}: page hashes do not continue the parent chain"
