"""Validation of caller input at the facade boundary (slot tensors, counts, ``InsertParams``).

Owns error messages for caller misuse only; changes nothing. Used by ``UnifiedCache``,
``NoPrefixCache`` and the linker's request entries (request ids, durations).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from radixlink.contract import InsertParams
from radixlink.tokens import token_bytes

_BOOLS = (bool, np.bool_)


def check_count(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


def check_req_id(req_id: Any) -> Any:
    """A request id is a hashable value (it keys the linker's tables)."""
    try:
        hash(req_id)
    except TypeError:
        raise ValueError(f"req_id must be hashable (a str or int), got unhashable "
                         f"{type(req_id).__name__} {req_id!r:.80}") from None
    return req_id


def check_seconds(name: str, value: Any, *, allow_zero: bool = False) -> float:
    """A duration: a real number, positive (or zero with ``allow_zero``), not NaN; inf is
    allowed (no deadline)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not (value >= 0 if allow_zero else value > 0):
        low = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a number of seconds {low}, got {value!r}")
    return float(value)


def check_slots(name: str, slots: Any, device: torch.device) -> None:
    if not isinstance(slots, torch.Tensor):
        raise ValueError(f"{name} must be an int64 torch.Tensor, got {type(slots).__name__}")
    if slots.dtype != torch.int64 or slots.dim() != 1:
        shape = tuple(slots.shape)
        raise ValueError(f"{name} must be a 1-D int64 tensor, got {slots.dtype} {shape}")
    if slots.device != device:
        raise ValueError(f"{name} is on {slots.device}, the cache is on {device}")


def check_insert_slots(params: InsertParams, aligned_len: int, full: Any, mamba: Any) -> None:
    """The slots of a validated ``InsertParams``: ``mamba_value`` a held state at a whole-page
    end, and ``value[prev_prefix_len:aligned_len]`` fresh caller-held pages (see
    ``check_fresh_slots``; ``value[:prev_prefix_len]`` is checked by the tree's walk)."""
    value = params.value
    if params.mamba_value is not None:
        if mamba is None:
            raise ValueError("mamba_value given but this cache has no MAMBA component")
        mamba.check_held(params.mamba_value, "InsertParams.mamba_value")
        if value.shape[0] != aligned_len:
            raise ValueError(
                f"mamba_value needs whole pages: value has {value.shape[0]} slots, "
                f"page_size={full.page_size}; insert value[:{aligned_len}] with the state at "
                "that boundary"
            )
    prev, ps = params.prev_prefix_len, full.page_size
    # NOTE: one host view of the slots for every check below: numpy ops cost ~1 us each here,
    # torch slicing and dispatch several (this runs on every insert)
    arr = value.numpy() if value.device.type == "cpu" else value.cpu().numpy()
    # NOTE: count_nonzero, not .all() / .any(): ~1 us where a ufunc reduction costs ~3 us
    if prev and np.count_nonzero(full.ownership.pages_owned(arr[:prev:ps] // ps)) < prev // ps:
        raise ValueError(
            f"insert value[:{prev}] (prev_prefix_len) holds slots the tree does not own; pass "
            "the device_indices of a match whose last_node you locked"
        )
    check_fresh_slots(full.allocator, full.ownership, arr, prev, aligned_len)


def check_linkable(config: Any, components: Any, pools: Any) -> None:
    """A cache a linker can attach to: page hashes on, and tensors behind every pool."""
    if not config.enable_external_cache_linker:
        raise ValueError(
            "attach_linker needs page hashes: build the cache with "
            "CacheConfig(..., enable_external_cache_linker=True)"
        )
    for component in components:
        if pools.get(component.pool_name) is None:
            raise ValueError(
                f"attach_linker needs page data: the {component.pool_name.value} pool has no "
                f"tensors; build the cache with CacheConfig(..., {component.layout_setting}=...)"
            )


def check_prefill(num_new: Any, num_cached: Any, seconds: Any) -> None:
    """Counts are non-negative ints; ``seconds`` a finite number >= 0."""
    check_count("num_new", num_new)
    check_count("num_cached", num_cached)
    if check_seconds("seconds", seconds, allow_zero=True) == float("inf"):
        raise ValueError("seconds must be finite, got inf")


def check_namespaced(config: Any, store: Any, *, close: bool = False) -> None:
    """A linker on a store other processes reach needs a model namespace: page keys hash the
    pool layout only, so without one a cache loads pages another model with the same KV
    layout wrote. With ``close``, the store is closed before the error is raised."""
    namespace = config.namespace
    if getattr(store, "shared", True) and (namespace is None or not namespace.model):
        if close:
            store.close()
        raise ValueError(
            f"a linker on a shared store ({type(store).__name__}) needs a model namespace: "
            "build the cache with CacheConfig(..., namespace=Namespace(model=<a fingerprint "
            "of the weights>)); without one, pages another model with the same KV layout "
            "wrote would load (only a process-private memory:// store may go without)"
        )


def check_fresh_slots(allocator: Any, ownership: Any, slots: np.ndarray, start: int,
                      end: int) -> None:
    """``slots[start:end]`` (host int64 slot ids) must be distinct, whole, page-aligned runs of
    slots that the caller holds (handed out by the allocator, not owned by the tree);
    ValueError naming the first bad slot and the rule otherwise. Vectorised: a few array ops
    per call."""
    part = slots[start:end]
    problem = allocator.explain_not_held(part)
    if problem is None:
        ps = allocator.page_size
        owned = ownership.pages_owned(part[::ps] // ps)
        if np.count_nonzero(owned):
            i = int(np.argmax(owned)) * ps
            problem = (f"slot {int(part[i])} at index {i} belongs to the tree (a matched or "
                       "inserted page); pass the match's prefix_len as prev_prefix_len")
    if problem is not None:
        raise ValueError(
            f"insert value[{start}:{end}] must be slots you hold from alloc: {problem}; "
            "nothing was inserted"
        )


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
    # NOTE: a truthy string ("no") would otherwise pass for True
    if not isinstance(params.chunked, _BOOLS):
        raise ValueError(f"InsertParams.chunked must be True or False, got {params.chunked!r}")
    if not isinstance(params.track_adopted_ranges, _BOOLS):
        raise ValueError("InsertParams.track_adopted_ranges must be True or False, got "
                         f"{params.track_adopted_ranges!r}")
    return key, num_value - num_value % page_size
