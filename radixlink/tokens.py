"""The one token packer: tokens as uint32 little-endian bytes (``token_bytes``), the input of
page hashes (``radixlink.hashing``) and the tree's keys (docs/hashing.md).

Owns the byte layout of a token and the checks on token values. Imports nothing from
radixlink; torch is only looked at if the caller already imported it.
"""

from __future__ import annotations

import array
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

TOKEN_BYTES = 4  # a packed token: uint32 little-endian
_CHUNK_PAGES = 512
_MAX_U32 = 0xFFFFFFFF
_U32 = np.dtype("<u4")
_BIG_ENDIAN = sys.byteorder == "big"


def token_bytes(tokens: Any) -> bytes:
    """``tokens`` packed as uint32 little-endian bytes: the page-hash input (docs/hashing.md)
    and the tree's keys. Takes what ``page_hashes`` takes.

    Raises:
        ValueError: naming the offending value, dtype or type.
    """
    if type(tokens) is list:  # NOTE: every match and insert: converted and checked in C
        return _pack(tokens).tobytes()
    if isinstance(tokens, np.ndarray) and tokens.dtype == _U32 and tokens.ndim == 1:
        return tokens.tobytes()  # NOTE: packed already (a linker's lookup keeps such arrays)
    arr = token_array(tokens)
    if not _in_range(arr):
        raise _range_error(arr)
    return arr.astype("<u4", copy=False).tobytes()


def token_array(tokens: Any) -> np.ndarray:
    """``tokens`` as a 1-D integer array; lists are range-checked here, arrays later."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(tokens, torch.Tensor):
        if tokens.dtype == torch.bool or tokens.is_floating_point() or tokens.is_complex():
            raise ValueError(f"tokens must be an integer tensor, got dtype {tokens.dtype}")
        tokens = tokens.detach().cpu().numpy()
    if isinstance(tokens, np.ndarray):
        return _check_array(tokens)
    if isinstance(tokens, (str, bytes, bytearray, memoryview)) or not hasattr(tokens, "__iter__"):
        raise ValueError(f"tokens must be a sequence of ints, got {type(tokens).__name__}")
    if not isinstance(tokens, Sequence):
        tokens = list(tokens)
    return np.frombuffer(_pack(tokens), dtype="<u4")


def _pack(tokens: Sequence[Any]) -> array.array:
    """A sequence of ints as a little-endian uint32 ``array``, range-checked."""
    # NOTE: only the first element is checked for bool: a full scan costs more than hashing.
    if len(tokens) and isinstance(tokens[0], (bool, np.bool_)):
        raise ValueError(f"tokens must be ints, got bool {tokens[0]!r} at index 0")
    try:
        # NOTE: array('I') converts and range-checks in C without building an argument tuple:
        # ~5x faster than np.asarray(list), ~10% faster than struct.pack(*tokens).
        packed = array.array("I", tokens)
    except (TypeError, OverflowError):
        raise _bad_token(tokens) from None
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed


def _check_array(arr: np.ndarray) -> np.ndarray:
    """Shape and dtype checks; token values are range-checked by ``page_chunks``."""
    if arr.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"tokens must have an integer dtype, got {arr.dtype}")
    return arr


def page_chunks(arr: np.ndarray, page_size: int) -> Iterator[list[bytes]]:
    """The bytes of each whole page of ``arr`` (uint32 LE per token), ``_CHUNK_PAGES`` pages
    at a time. Raises ValueError (before the first chunk with it) for a token outside
    ``[0, 2**32)``, the partial tail included."""
    num_tokens = arr.shape[0] // page_size * page_size
    if not _in_range(arr[num_tokens:]):
        raise _range_error(arr)
    page_void, step = f"V{4 * page_size}", _CHUNK_PAGES * page_size
    # NOTE: a chunk at a time, tokens are checked, cast and split while in cache, and the
    # chunk's bytes and digests are freed and reused. Whole-call lists of them touched ~1 MB
    # of fresh memory per 4096 pages (~200 page faults a call); on 512K tokens this is 10-25%.
    whole = arr[:num_tokens]
    for start in range(0, num_tokens, step):
        part = whole[start : start + step]
        if not _in_range(part):
            raise _range_error(arr)
        # NOTE: a void view makes tolist() give one bytes object per page in a single C call,
        # so the hash loop does no slicing. Void items keep trailing zero bytes (unlike 'S').
        yield np.ascontiguousarray(part, dtype="<u4").view(page_void).tolist()


def _in_range(arr: np.ndarray) -> bool:
    """Whether every value of the integer array ``arr`` is in ``[0, 2**32)``."""
    if not arr.size or (arr.dtype.kind == "u" and arr.dtype.itemsize <= 4):
        return True
    if arr.dtype.itemsize <= 4:
        return int(arr.min()) >= 0
    # NOTE: seen as unsigned, negatives are huge, so one max() bounds both ends.
    return int(arr.view(arr.dtype.str.replace("i", "u")).max()) <= _MAX_U32


def _range_error(arr: np.ndarray) -> ValueError:
    """Error path only: name the first out-of-range extreme of ``arr``."""
    lo, hi = int(arr.min()), int(arr.max())
    bad = lo if lo < 0 else hi
    index = int(np.argmax(arr == bad))
    return ValueError(
        f"tokens must be in [0, 2**32), got {bad} at index {index} (dtype {arr.dtype})"
    )


def _bad_token(tokens: Sequence[Any]) -> ValueError:
    """Error path only: find the first element that is not an int in [0, 2**32)."""
    for index, value in enumerate(tokens):
        is_int = hasattr(value, "__index__") and not isinstance(value, (bool, np.bool_))
        if not is_int or not 0 <= int(value) <= _MAX_U32:
            return ValueError(f"tokens must be ints in [0, 2**32), got {value!r} at index {index}")
    return ValueError(f"tokens must be ints in [0, 2**32), got {type(tokens).__name__}")
