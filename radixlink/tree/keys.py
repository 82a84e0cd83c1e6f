"""Tree keys: token sequences packed as bytes (uint32 little-endian per token) and their compare.

Owns the conversion of user token containers and the page-aligned common-prefix search. Knows
nothing of nodes, components or memory.

NOTE: keys are bytes because a radix walk compares every key token once; memcmp on bytes is
~50x cheaper per token than comparing tuples of Python ints, and the packed form is exactly the
hash input of DESIGN.md section 6 (4-byte LE tokens).
"""

from __future__ import annotations

import array
import sys
from typing import Any

import numpy as np

TOKEN_BYTES = 4
_MAX_TOKEN = 0xFFFFFFFF
_BIG_ENDIAN = sys.byteorder == "big"
assert array.array("I").itemsize == TOKEN_BYTES, "array('I') is not 4 bytes on this platform"


def token_bytes(tokens: Any) -> bytes:
    """Pack ``tokens`` as uint32 little-endian bytes.

    Args:
        tokens: a list/tuple/range of ints, a 1-D integer numpy array or a 1-D integer torch
            tensor (any device), with values in ``[0, 2**32)``.

    Returns:
        ``4 * len(tokens)`` bytes.

    Raises:
        ValueError: naming the offending value or type.
    """
    if isinstance(tokens, list):
        return _pack_list(tokens)
    if isinstance(tokens, np.ndarray):
        return _pack_array(tokens)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(tokens, torch.Tensor):
        if tokens.dtype == torch.bool or tokens.is_floating_point() or tokens.is_complex():
            raise ValueError(f"tokens must be an integer tensor, got dtype {tokens.dtype}")
        return _pack_array(tokens.detach().cpu().numpy())
    if isinstance(tokens, (str, bytes, bytearray, memoryview)) or not hasattr(tokens, "__iter__"):
        raise ValueError(
            f"tokens must be a list, numpy array or tensor of ints, got {type(tokens).__name__}"
        )
    return _pack_list(list(tokens))


def _pack_list(tokens: list[Any]) -> bytes:
    if tokens and isinstance(tokens[0], (bool, np.bool_)):
        raise ValueError(f"tokens must be ints, got bool {tokens[0]!r} at index 0")
    try:
        # NOTE: array('I') converts and range-checks in C without building an argument tuple:
        # ~10% faster than struct.pack(*tokens) and ~3x faster than numpy on a list.
        packed = array.array("I", tokens)
    except (TypeError, OverflowError):
        raise _bad_token(tokens) from None
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def _pack_array(arr: np.ndarray) -> bytes:
    if arr.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"tokens must have an integer dtype, got {arr.dtype}")
    if arr.size and (arr.dtype.kind == "i" or arr.dtype.itemsize > 4):
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi > _MAX_TOKEN:
            bad = lo if lo < 0 else hi
            index = int(np.argmax(arr == bad))
            raise ValueError(f"tokens must be in [0, 2**32), got {bad} at index {index}")
    return arr.astype("<u4", copy=False).tobytes()


def _bad_token(tokens: list[Any]) -> ValueError:
    """Error path only: name the first element that is not an int in [0, 2**32)."""
    for index, value in enumerate(tokens):
        is_int = hasattr(value, "__index__") and not isinstance(value, (bool, np.bool_))
        if not is_int or not 0 <= int(value) <= _MAX_TOKEN:
            return ValueError(f"tokens must be ints in [0, 2**32), got {value!r} at index {index}")
    return ValueError("tokens must be ints in [0, 2**32)")


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
