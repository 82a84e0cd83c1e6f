"""``LayerProgress``: how far a load has landed, per pool and layer; the worker records each
layer as it lands, a layer-wise engine waits for the layer it is about to read.

Owns one load's landing counters and CUDA events. Must not touch pools, the tree or stores.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from radixlink.contract import PoolName


class LayerProgress:
    """How far a load has landed, per pool and layer: the worker calls ``land`` after each
    layer's write (recording a CUDA event on its stream), the engine's forward calls ``wait``
    before layer ``i`` reads the pool (SGLang's layer counter, vLLM's ``wait_for_layer_load``).

    Pools that land whole (Mamba states) land before layer 0 of any other pool. The worker
    lands layer by layer only when someone ``watch``ed the load before its pages were
    verified (a layer-wise engine); otherwise each pool lands in one copy (fewer, larger
    copies) and all its layers land at once.

    Args:
        layers: per pool taking part, its number of layers (0: lands whole).
    """

    def __init__(self, layers: dict[PoolName, int]):
        self._layers = dict(layers)
        self._landed = dict.fromkeys(layers, 0)
        self._events: dict[tuple[PoolName, int], Any] = {}
        self._failed = False
        self.watched = False  # someone asked for layer-by-layer landing (``watch``)
        self._cond = threading.Condition()

    def watch(self) -> None:
        """Ask for layer-by-layer landing (an engine will wait per layer)."""
        self.watched = True

    def land(self, pool: PoolName, layer: int | None, event: Any = None) -> None:
        """Layer ``layer`` of ``pool`` is written (``None``: the whole pool)."""
        with self._cond:
            done = max(1, self._layers[pool]) if layer is None else layer + 1
            if event is not None:
                self._events[(pool, done - 1)] = event
            self._landed[pool] = max(self._landed[pool], done)
            self._cond.notify_all()

    def fail(self) -> None:
        """The load failed or was cancelled: every waiter gets False."""
        with self._cond:
            self._failed = True
            self._cond.notify_all()

    @property
    def complete(self) -> bool:
        with self._cond:
            return not self._failed and all(
                self._landed[p] >= max(1, n) for p, n in self._layers.items())

    def wait(self, pool: PoolName, layer: int, timeout: float | None = None) -> bool:
        """Block until layer ``layer`` of ``pool`` has landed (a pool taking no part: at
        once). On CUDA the caller's current stream then waits for that layer's copy (no host
        block). False when the load failed, was cancelled, or ``timeout`` passed."""
        if pool not in self._layers:
            return True
        need = min(layer, max(1, self._layers[pool]) - 1) + 1
        with self._cond:
            ok = self._cond.wait_for(lambda: self._failed or self._landed[pool] >= need,
                                     timeout)
            if not ok or self._failed:
                return False
            event = self._events.get((pool, need - 1))
        if event is not None:  # NOTE: the GPU waits, not the host
            torch.cuda.current_stream().wait_event(event)
        return True
