"""Page hashes of a new leaf: the chain continued from its parent, taking the hashes a caller
already computed for these tokens (a linker's lookup) and computing only the rest.

Owns no state. Must not reshape the tree; knows a node only by its key, parent and hashes.
"""

from __future__ import annotations

from radixlink.hashing import page_hashes
from radixlink.tree.keys import TOKEN_BYTES, key_tokens
from radixlink.tree.node import TreeNode


def leaf_hashes(parent: TreeNode, key: bytes, page_size: int, algo: str,
                known: tuple[int, list[str]] | None) -> list[str]:
    """Chain hashes of a new leaf's pages (``key``) under ``parent``: those ``known`` =
    ``(first page, hashes)`` covers are taken from it, the others are computed (continuing the
    chain either side).

    ::

        leaf pages   first ............................. first + n
        known             start ........ start + len(hashes)
        hashes       |-- computed --|--- taken ---|-- computed --|
    """
    page_bytes = page_size * TOKEN_BYTES
    first, n = parent.seq_len // page_size, len(key) // page_bytes
    if known is None:
        return _hash_pages(parent, key, page_size, algo, None)
    start, hashes = known
    lo, hi = max(first, start), min(first + n, start + len(hashes))
    if hi <= lo:
        return _hash_pages(parent, key, page_size, algo, None)
    out = _hash_pages(parent, key[: (lo - first) * page_bytes], page_size, algo, None)
    out += hashes[lo - start : hi - start]
    if hi < first + n:
        out += _hash_pages(parent, key[(hi - first) * page_bytes :], page_size, algo, out[-1])
    return out


def _hash_pages(parent: TreeNode, key: bytes, page_size: int, algo: str,
                after: str | None) -> list[str]:
    """Hashes of ``key``'s pages continuing the chain at ``after`` (else ``parent``'s end, else
    its namespace seed)."""
    if not key:
        return []
    if after is None and parent.hash_value:
        after = parent.hash_value[-1]
    namespace = parent.namespace if after is None else None  # a root: its seed starts it
    return page_hashes(key_tokens(key), page_size, namespace, parent=after, algo=algo)
