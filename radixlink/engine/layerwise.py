"""Layer-wise store loads for the reference engine: which pool layer each model layer reads,
and the per-layer wait the forward pass calls while a load is still landing.

Owns no state. Must not touch the cache or the linker beyond a ``Landing``'s public wait.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixlink.contract import ComponentType, PoolName
from radixlink.engine.model import ModelSpec

_POOL_OF = {ComponentType.FULL: PoolName.KV, ComponentType.SWA: PoolName.SWA,
            ComponentType.MAMBA: PoolName.MAMBA}


class LoadFailed(Exception):
    """A layer never landed (the load failed, was cancelled or timed out): the engine drops
    the pass and recomputes the prefix."""


def layer_pools(spec: ModelSpec) -> list[tuple[PoolName, int]]:
    """Per model layer, the pool it reads and its layer index in that pool (a Mamba layer's
    state lands whole: index 0)."""
    out = []
    for i, kind in enumerate(spec.layer_types):
        index = 0 if kind is ComponentType.MAMBA else spec.layer_ids(kind).index(i)
        out.append((_POOL_OF[kind], index))
    return out


def layer_waiter(landing: Any, pools: list[tuple[PoolName, int]],
                 timeout_s: float) -> Callable[[int], None]:
    """The ``ForwardInput.wait_layer`` of a pass over a landing prefix: it blocks until model
    layer ``i``'s pool layer has landed and raises ``LoadFailed`` when it never will."""

    def wait(i: int) -> None:
        pool, index = pools[i]
        if not landing.wait_layer(pool, index, timeout_s):
            raise LoadFailed(f"layer {i} ({pool.value} layer {index}) did not land")

    return wait
