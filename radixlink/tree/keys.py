"""Tree keys: token sequences packed as bytes (uint32 little-endian per token, by the one packer,
``tokens.token_bytes``) and their compare.

Owns the page-aligned common-prefix search and the packer's memo of the last matched list.
Knows nothing of nodes, components or memory.

NOTE: keys are bytes because a radix walk compares every key token once; memcmp on bytes is
~50x cheaper per token than comparing tuples of Python ints, and the packed form is exactly the
hash input of DESIGN.md section 6 (4-byte LE tokens).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from radixlink.tokens import token_bytes


def common_prefix_bytes(node_key: bytes, key: bytes, offset: int, page_bytes: int) -> int:
    """Bytes of ``node_key`` that equal ``key[offset:]``, rounded down to whole pages.

    ::

        node_key   |p0|p1|p2|p3|
        key[off:]  |p0|p1|pX|..     -> 2 * page_bytes
    """
    limit = min(len(node_key), len(key) - offset)
    limit -= limit % page_bytes
    a = node_key[:limit]
    b = key[offset : offset + limit]
    if a == b:
        return limit
    # NOTE: XOR of the two little-endian integers has its lowest set bit in the first byte that
    # differs: one C-speed pass instead of a Python loop or a binary search of slices.
    diff = int.from_bytes(a, "little") ^ int.from_bytes(b, "little")
    first_byte = ((diff & -diff).bit_length() - 1) >> 3
    return first_byte - first_byte % page_bytes


def key_tokens(key: bytes) -> np.ndarray:
    """The tokens of a packed key as a read-only uint32 array (no copy)."""
    return np.frombuffer(key, dtype="<u4")


class KeyPacker:
    """``token_bytes`` with a one-entry memo of the last packed list.

    NOTE: engines insert ``prompt + output`` right after matching ``prompt``. The new list's
    head is compared with a snapshot of the matched list (the same int objects: a pointer
    compare per token) and only the rest is packed, ~1.4x cheaper than packing the whole key
    again. The snapshot is a shallow copy taken at ``pack`` (~5 us at 2k tokens): comparing
    with the caller's list itself would miss an edit made in place since its match, and the
    remembered bytes would then name tokens the caller's KV was not computed for.
    """

    __slots__ = ("_snapshot", "_key")

    def __init__(self) -> None:
        self._snapshot: list[Any] = []
        self._key = b""

    def pack(self, tokens: Any) -> bytes:
        """``token_bytes(tokens)``, remembering a list for a later ``pack_extension``."""
        key = token_bytes(tokens)
        if type(tokens) is list and tokens:
            self._snapshot, self._key = tokens[:], key
        return key

    def pack_extension(self, tokens: Any) -> bytes:
        """``token_bytes(tokens)``, reusing the remembered list's bytes when it is a prefix."""
        snapshot = self._snapshot
        n = len(snapshot)
        if n and type(tokens) is list and len(tokens) >= n and tokens[:n] == snapshot:
            return self._key + token_bytes(tokens[n:])
        return token_bytes(tokens)
