"""The one request loop tests share (STYLE.md section 10): match (+ LOOKUP and load through a
linker) -> lock -> alloc the rest -> compute -> insert whole pages (+ the state at their end) ->
free the partial tail -> unlock. What "compute" writes is the caller's callback.

Owns nothing of the library; uses only its public API.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from radixlink.contract import InsertParams, InsertResult, PoolName

Compute = Callable[[Any, torch.Tensor, list[int], int], None]
"""``compute(cache, kv, tokens, start)``: the request's slots ``kv`` cover ``tokens`` (the
reused prefix ``kv[:start]``, then fresh slots); write what a model writes for
``tokens[start:]`` at ``kv[start:]`` (and check the prefix, if you like)."""


@dataclass(slots=True, kw_only=True)
class Served:
    """What one request found and did."""

    device_len: int  # the device match
    hit_len: int  # what the store could restore beyond it (LOOKUP)
    prefix_len: int  # what the request reused (device + loaded)
    load: Any = None  # the LoadOutcome, when a load ran
    insert: InsertResult | None = None  # None when there was no room


def serve(cache: Any, tokens: list[int], *, linker: Any = None, req_id: Any = None,
          compute: Compute | None = None, state: Callable[[list[int]], torch.Tensor] | None = None,
          namespace: Any = None, check: bool = False, **insert_kw: Any) -> Served:
    """Serve one request by the documented protocol (no room: nothing is inserted).

    Args:
        linker: with ``req_id``, LOOKUP at match and load when the store has more.
        compute: the "model" (None: slots only, for index-only caches).
        state: the recurrent state after a token prefix (MAMBA caches with a state pool); its
            bytes are inserted as ``mamba_value`` at the last whole page.
        check: ``check_invariants()`` afterwards.
        insert_kw: extra ``InsertParams`` fields (``chunked``, ``track_adopted_ranges``...).
    """
    m = cache.match_prefix(tokens, req_id=req_id if linker is not None else None,
                           namespace=namespace)
    prefix, slots, out = m.prefix_len, m.device_indices, None
    if linker is not None and m.external_hit_len and linker.load(req_id):
        out = linker.wait_load(req_id)
        prefix, slots, handle = out.prefix_len, out.device_indices, out.lock
    else:
        handle = cache.lock(m.last_node)
    served = Served(device_len=m.prefix_len, hit_len=m.external_hit_len, prefix_len=prefix,
                    load=out)
    new = cache.alloc(len(tokens) - prefix)
    if new is None:
        cache.unlock(handle)
        return served
    kv = torch.cat([slots, new])
    if compute is not None:
        compute(cache, kv[: len(tokens)], tokens, prefix)
    n = len(tokens) // cache.page_size * cache.page_size
    slot = None
    if state is not None and n:
        slot = cache.hybrid.alloc_state()
        assert slot is not None, "no state slot for the request"
        cache.pool(PoolName.MAMBA).write_state(slot, state(tokens[:n]))
    served.insert = cache.insert(InsertParams(key=tokens, value=kv[:n], prev_prefix_len=prefix,
                                              mamba_value=slot, namespace=namespace,
                                              **insert_kw))
    if kv.shape[0] > n:
        cache.free(kv[n:])
    cache.unlock(handle)
    if check:
        cache.check_invariants()
    return served
