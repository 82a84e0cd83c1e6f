"""Validation of caller input at the facade boundary (slot tensors, counts, ``InsertParams``).

Owns error messages for caller misuse only; changes nothing. Used by ``UnifiedCache`` and
``NoPrefixCache``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from radixlink.contract import InsertParams
from radixlink.tree.keys import token_bytes


def check_count(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


def check_slots(name: str, slots: Any, device: torch.device) -> None:
    if not isinstance(slots, torch.Tensor):
        raise ValueError(f"{name} must be an int64 torch.Tensor, got {type(slots).__name__}")
    if slots.dtype != torch.int64 or slots.dim() != 1:
        shape = tuple(slots.shape)
        raise ValueError(f"{name} must be a 1-D int64 tensor, got {slots.dtype} {shape}")
    if slots.device != device:
        raise ValueError(f"{name} is on {slots.device}, the cache is on {device}")


def check_insert(
    params: Any,
    page_size: int,
    device: torch.device,
    pack: Callable[[Any], bytes] = token_bytes,
) -> tuple[bytes, int]:
    """Validate an ``InsertParams``; return the packed key and the whole-page length."""
    if not isinstance(params, InsertParams):
        raise ValueError(f"insert takes an InsertParams, got {type(params).__name__}")
    key = pack(params.key)
    check_slots("InsertParams.value", params.value, device)
    num_key, num_value = len(key) >> 2, params.value.shape[0]
    if num_value > num_key:
        raise ValueError(
            f"insert value has {num_value} slots but the key only {num_key} tokens; pass "
            "value[:len(key)]"
        )
    prev = params.prev_prefix_len
    if not isinstance(prev, int) or isinstance(prev, bool) or not 0 <= prev <= num_value:
        raise ValueError(
            f"prev_prefix_len must be an int in [0, {num_value}] (len(value)), got {prev!r}"
        )
    if prev % page_size:
        raise ValueError(
            f"prev_prefix_len={prev} is not a multiple of page_size={page_size}; pass the "
            "prefix_len of a match (always page aligned)"
        )
    seqlen = params.swa_evicted_seqlen
    if not isinstance(seqlen, int) or isinstance(seqlen, bool) or seqlen < 0:
        raise ValueError(f"swa_evicted_seqlen must be a non-negative int, got {seqlen!r}")
    return key, num_value - num_value % page_size
