"""Engine-compatible page hashes: the chain SGLang 0.5.23 names its stored pages by.

Owns the byte layout of SGLang's ``get_hash_str`` / ``get_storage_hash_str`` /
``storage_namespace_seed`` (spec: docs/integrations.md, "Page hashes") so radixlink
tools can address pages an SGLang engine wrote. Imports nothing from radixlink or SGLang.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

SGLANG_NAMESPACE_TAG = b"sglang-cache-namespace-v1"
"""The first bytes hashed into an SGLang namespace seed."""

WIDE_PAGE_TAG = b"\xff"
"""Prefix of a page hashed in the tagged u64 encoding (a token >= 2**32 on the page)."""

_MAX_U32 = 0xFFFFFFFF
_MAX_I64 = 0x7FFFFFFFFFFFFFFF


def sglang_namespace_seed(extra_key: str | None, cache_salt: str | None) -> str | None:
    """The hex chain start SGLang gives a request namespace (LoRA / extra key, cache salt).

    ``SHA-256(tag || part(extra_key) || part(cache_salt))`` where a part is ``0x00`` when
    absent, else ``0x01 || len(utf8) as u64 LE || utf8``: absent, empty and joined parts all
    hash differently. No namespace at all (both None) gives None: the chain starts empty.
    """
    if extra_key is None and cache_salt is None:
        return None
    digest = hashlib.sha256(SGLANG_NAMESPACE_TAG)
    for part in (extra_key, cache_salt):
        if part is None:
            digest.update(b"\x00")
            continue
        if not isinstance(part, str):
            raise ValueError(f"namespace parts must be str or None, got {part!r}")
        raw = part.encode("utf-8")
        digest.update(b"\x01" + len(raw).to_bytes(8, "little") + raw)
    return digest.hexdigest()


def sglang_page_hashes(
    tokens: Any,
    page_size: int,
    prior_hash: str | None = None,
    *,
    bigram: bool = False,
) -> list[str]:
    """SGLang's ``get_hash_str(tokens, prior_hash, page_size)``: one hex SHA-256 per page.

    ::

        tokens  | page 0          | page 1          | partial tail  |
        hash    h_0 = H(h_-1 || B_0)  h_1 = H(h_0 || B_1)  h_2 = H(h_1 || B_2)
        B_i     tokens as u32 LE, or 0xff || tokens as u64 LE when one is >= 2**32
        h_-1    bytes.fromhex(prior_hash), empty when prior_hash is None or ""

    Unlike ``radixlink.hashing.page_hashes`` the partial tail page is hashed too.

    Args:
        tokens: non-negative int64 token ids: a sequence of ints, a 1-D integer array or
            tensor; a 2-D ``[n, k]`` array (or a sequence of k-tuples) for multi-id tokens,
            hashed as their flattened ids.
        page_size: tokens per page, a positive int.
        prior_hash: hex digest the chain continues from (the page before ``tokens``).
        bigram: EAGLE bigram keys: ``tokens`` is the raw sequence t_0..t_n and the key is
            its n pairs ``(t_i, t_{i+1})``, each hashed as two ids. A page's encoding turns
            wide when any raw token it reads (its pairs plus the next page's first token)
            is >= 2**32.

    Returns:
        ``ceil(n / page_size)`` lowercase hex digests (n = number of tokens, or of pairs).

    Raises:
        ValueError: a bad page size or prior hash, or a token outside ``[0, 2**63)``.
    """
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size <= 0:
        raise ValueError(f"page_size must be a positive int, got {page_size!r}")
    prev = _parse_prior(prior_hash)
    raw = _token_array(tokens)
    if bigram:
        if raw.ndim != 1:
            raise ValueError(f"bigram tokens must be 1-D, got shape {raw.shape}")
        return _bigram_chain(raw, page_size, prev)
    units = raw.reshape(raw.shape[0], -1) if raw.size else raw.reshape(0, 1)  # [n, ids/token]
    out: list[str] = []
    for start in range(0, units.shape[0], page_size):
        page = units[start : start + page_size].reshape(-1)
        prev = _hash_page(prev, page, page)
        out.append(prev.hex())
    return out


def sglang_storage_page_hashes(
    tokens: Any,
    page_size: int,
    prior_hash: str | None = None,
    *,
    extra_key: str | None = None,
    cache_salt: str | None = None,
    bigram: bool = False,
) -> list[str]:
    """SGLang's ``get_storage_hash_str``: the chain of stored pages (HiCache L3, linker).

    A new chain (``prior_hash`` None) starts at ``sglang_namespace_seed(extra_key,
    cache_salt)``; a continued chain already commits to its namespace. Otherwise as
    ``sglang_page_hashes``.
    """
    if prior_hash is None:
        prior_hash = sglang_namespace_seed(extra_key, cache_salt)
    return sglang_page_hashes(tokens, page_size, prior_hash, bigram=bigram)


def _bigram_chain(raw: np.ndarray, page_size: int, prev: bytes) -> list[str]:
    num_pairs = max(raw.shape[0] - 1, 0)
    out: list[str] = []
    for start in range(0, num_pairs, page_size):
        count = min(page_size, num_pairs - start)
        window = raw[start : start + count + 1]  # the page's pairs read count + 1 raw ids
        pairs = np.stack((window[:-1], window[1:]), axis=1).reshape(-1)
        prev = _hash_page(prev, pairs, window)
        out.append(prev.hex())
    return out


def _hash_page(prev: bytes, words: np.ndarray, probe: np.ndarray) -> bytes:
    """``H(prev || words)``: u32 LE words, or the tagged u64 form when ``probe`` holds an id
    that does not fit in 32 bits."""
    digest = hashlib.sha256(prev)
    if probe.size and int(probe.max()) > _MAX_U32:
        digest.update(WIDE_PAGE_TAG)
        digest.update(words.astype("<u8").tobytes())
    else:
        digest.update(words.astype("<u4").tobytes())
    return digest.digest()


def _parse_prior(prior_hash: str | None) -> bytes:
    if not prior_hash:
        return b""
    try:
        raw = bytes.fromhex(prior_hash)
    except (TypeError, ValueError):
        raw = b""
    if len(raw) != 32:
        raise ValueError(
            f"prior_hash must be a 64-char hex SHA-256 digest (a previous page's hash), "
            f"got {prior_hash!r}"
        )
    return raw


def _token_array(tokens: Any) -> np.ndarray:
    """``tokens`` as a uint64 array (1-D, or 2-D for multi-id tokens), range-checked."""
    if hasattr(tokens, "detach") and hasattr(tokens, "cpu"):  # a torch tensor
        tokens = tokens.detach().cpu().numpy()
    if isinstance(tokens, np.ndarray):
        arr = tokens
    elif isinstance(tokens, (str, bytes, bytearray)) or not hasattr(tokens, "__iter__"):
        raise ValueError(f"tokens must be a sequence of ints, got {type(tokens).__name__}")
    else:
        try:  # NOTE: array('q'/'I') converts through the buffer protocol, without a list
            arr = np.asarray(tokens if hasattr(tokens, "__len__") else list(tokens))
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"tokens must be ints in [0, 2**63): {exc}") from None
    if arr.size == 0:
        return np.zeros((0,), dtype=np.uint64)
    if arr.dtype.kind not in "iu" or arr.ndim not in (1, 2):
        raise ValueError(
            f"tokens must be a 1-D (or [n, k] for multi-id tokens) integer array, got "
            f"dtype {arr.dtype} shape {arr.shape}"
        )
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi > _MAX_I64:
        bad = lo if lo < 0 else hi
        raise ValueError(f"tokens must be in [0, 2**63), got {bad}")
    return arr.astype(np.uint64, copy=False)
