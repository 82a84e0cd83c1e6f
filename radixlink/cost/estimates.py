"""What the cost model reads: transfer paths (bandwidth + latency) and prefill time as a function
of context length, as frozen snapshots.

Owns the arithmetic of one transfer and one prefill. Pure: no I/O, no clocks, no state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def _check(name: str, value: float, *, positive: bool) -> None:
    ok = math.isfinite(value) and (value > 0 if positive else value >= 0)
    if not ok:
        need = "a finite number > 0" if positive else "a finite number >= 0"
        raise ValueError(f"{name} must be {need}, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferEstimate:
    """One transfer path into the device (store -> device, another node's device -> device).

    ``seconds(b) = latency_s + b / bytes_per_s`` for ``b > 0`` bytes, 0 for nothing.

    Attributes:
        bytes_per_s: sustained bandwidth of the path (bytes per second).
        latency_s: fixed cost of one transfer (request round trip, setup).
    """

    bytes_per_s: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        _check("TransferEstimate.bytes_per_s", self.bytes_per_s, positive=True)
        _check("TransferEstimate.latency_s", self.latency_s, positive=False)

    def seconds(self, num_bytes: float) -> float:
        """Time to move ``num_bytes`` (0.0 for none)."""
        return self.latency_s + num_bytes / self.bytes_per_s if num_bytes > 0 else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillEstimate:
    """Prefill time of a transformer as a function of context.

    Computing positions ``[start, end)`` costs ``token_s`` per token (the weight GEMMs) plus
    ``pair_s`` per (query, key) attention pair, where the token at position ``i`` attends to
    ``i + 1`` keys; one forward pass adds ``overhead_s``::

        positions   0 .......... start ............ end
                    |-- cached --|---- computed ----|
        span_s  = token_s * (end - start) + pair_s * sum(i + 1 for i in [start, end))

    Attributes:
        token_s: seconds per computed token independent of context.
        pair_s: seconds per attention (query, key) pair.
        overhead_s: seconds per forward pass (launch, scheduling, sampling).
    """

    token_s: float
    pair_s: float = 0.0
    overhead_s: float = 0.0

    def __post_init__(self) -> None:
        _check("PrefillEstimate.token_s", self.token_s, positive=True)
        _check("PrefillEstimate.pair_s", self.pair_s, positive=False)
        _check("PrefillEstimate.overhead_s", self.overhead_s, positive=False)

    def span_s(self, start: int, end: int) -> float:
        """Compute time of positions ``[start, end)``, without the per-pass overhead."""
        if end <= start:
            return 0.0
        pairs = (end * (end + 1) - start * (start + 1)) // 2
        return self.token_s * (end - start) + self.pair_s * pairs

    def seconds(self, num_new: int, num_cached: int = 0) -> float:
        """One prefill pass of ``num_new`` tokens after ``num_cached`` cached ones (0.0 for
        nothing to compute)."""
        if num_new <= 0:
            return 0.0
        return self.overhead_s + self.span_s(num_cached, num_cached + num_new)


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimates:
    """Everything the cost model needs for one decision, as one immutable snapshot.

    Attributes:
        prefill: prefill time as a function of context.
        bytes_per_token: KV bytes one token occupies on every path (all layers, K and V).
        store: the shared store's path into a device; None = no store.
        peer: another node's device into this one; None = no device-to-device transfers.
        decode_token_s: seconds per generated token after the first, for engines whose queue
            also holds decoding requests (0 for prefill-only nodes).
    """

    prefill: PrefillEstimate
    bytes_per_token: int
    store: TransferEstimate | None = None
    peer: TransferEstimate | None = None
    decode_token_s: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.bytes_per_token, int) or self.bytes_per_token <= 0:
            raise ValueError(f"Estimates.bytes_per_token must be a positive int, got "
                             f"{self.bytes_per_token!r}")
        _check("Estimates.decode_token_s", self.decode_token_s, positive=False)

    def load_s(self, transfer: TransferEstimate, num_tokens: int) -> float:
        """Time to bring ``num_tokens`` tokens' KV over ``transfer``."""
        return transfer.seconds(num_tokens * self.bytes_per_token)
