"""``TimedLoadCounter``: SGLang's ``LayerWiseLoadCounter`` that also times how long the forward
waited on each load batch, so a store hit's cost to its request can be told apart from the
load's own length.

A load batch starts as the scheduler builds the batch (``ready_to_load_host_cache``) and runs
while the scheduler prepares it; the forward blocks only once it reaches a layer not yet
landed. What the request paid for the load is that wait, not the load's wall time.

Owns the wait timing. Imports SGLang (its counter); touches nothing but the counter.
"""

from __future__ import annotations

import time

from sglang.srt.mem_cache.unified_cache.unified_cache_linker import LayerWiseLoadCounter


class TimedLoadCounter(LayerWiseLoadCounter):
    """``LayerWiseLoadCounter`` plus, per batch index, the seconds the forward spent in
    ``wait_until`` for it (every layer's wait summed), until ``pop_waited`` takes them."""

    def __init__(self, num_layers: int) -> None:
        super().__init__(num_layers)
        self._waited: dict[int, float] = {}

    def wait_until(self, threshold: int) -> None:
        index = self.consumer_index
        if index not in self.futures:  # NOTE: no batch in flight for this forward (none, or
            super().wait_until(threshold)  # finished: a decode step keeps its index)
            return
        start = time.perf_counter()
        try:
            super().wait_until(threshold)
        finally:
            self._waited[index] = self._waited.get(index, 0.0) + time.perf_counter() - start

    def pop_waited(self, index: int) -> float:
        """Seconds the forward waited on batch ``index`` (0.0 if it never waited), forgotten."""
        return self._waited.pop(index, 0.0)

    def reset(self) -> None:
        super().reset()
        self._waited.clear()
