"""Moving estimates: bandwidth and latency of each transfer path and the prefill-time
coefficients, fitted from observed transfers and prefills, starting from configured priors.

Owns the fits. Observations come from the caller (the engine's timings, the linker's stats,
a simulator); this module reads no clock and touches no cache, linker or store.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from radixlink.cost.estimates import Estimates, PrefillEstimate, TransferEstimate
from radixlink.cost.ttft import Source

_MIN_COEF = 1e-15  # NOTE: keeps a fitted slope positive (a zero slope would be infinite speed)


class DecayedFit:
    """``y ~ coef . x`` by exponentially forgetting least squares, starting from a prior.

    Minimises ``sum_i w_i (y_i - coef . x_i)^2`` with ``w_i = 0.5 ** (age_i / half_life)``
    (age in observations). The prior enters as ``prior_weight`` pseudo-observations at each of
    ``points`` with ``y = prior . x``, forgotten like any other observation: it pulls the
    predictions at typical sizes, not single coefficients, and fades as data arrive.
    Coefficients are kept non-negative; the slope ones (index >= 1) positive.

    Args:
        prior: the coefficients before any observation.
        points: typical feature vectors (together they must determine every coefficient).
        half_life: observations after which an observation's weight halves.
        prior_weight: how many observations the prior is worth at each point.
    """

    def __init__(self, prior: Sequence[float], points: Sequence[Sequence[float]], *,
                 half_life: float = 256.0, prior_weight: float = 1.0):
        pts = np.asarray(points, dtype=np.float64)
        if not prior or pts.ndim != 2 or pts.shape[1] != len(prior):
            raise ValueError(f"need points of {len(prior)} features each, got shape {pts.shape}")
        if half_life <= 0 or prior_weight <= 0:
            raise ValueError(f"half_life and prior_weight must be > 0, got {half_life}, "
                             f"{prior_weight}")
        # NOTE: fitted in units of each feature's largest typical size, so the normal
        # equations stay well conditioned when features differ by many orders of magnitude.
        self._scales = np.maximum(np.abs(pts).max(axis=0), 1e-300)
        self._ridge = 1e-12 * np.eye(len(prior))  # NOTE: only keeps the system solvable
        self._decay = 0.5 ** (1.0 / half_life)
        n = len(prior)
        self._xx = np.zeros((n, n))
        self._xy = np.zeros(n)
        coef = np.asarray(prior, dtype=np.float64)
        for point in pts:
            v = point / self._scales
            self._xx += prior_weight * np.outer(v, v)
            self._xy += prior_weight * v * float(point @ coef)
        self.num_observed = 0
        self._coef: tuple[float, ...] | None = tuple(float(p) for p in prior)

    def observe(self, x: Sequence[float], y: float) -> None:
        """Add one observation (non-finite ones are ignored)."""
        v = np.asarray(x, dtype=np.float64) / self._scales
        if not (np.all(np.isfinite(v)) and math.isfinite(y)):
            return
        self._xx = self._decay * self._xx + np.outer(v, v)
        self._xy = self._decay * self._xy + v * y
        self.num_observed += 1
        self._coef = None

    def coefficients(self) -> tuple[float, ...]:
        """The current fit (cached until the next observation)."""
        if self._coef is None:
            a, b = self._xx + self._ridge, self._xy
            floor = np.full(len(b), _MIN_COEF) * self._scales
            floor[0] = 0.0
            fixed = np.zeros(len(b), dtype=bool)
            for _ in range(len(b)):  # NOTE: active set: pin violators at their floor, refit
                free = ~fixed
                coef = floor.copy()
                rhs = b[free] - a[np.ix_(free, fixed)] @ floor[fixed]
                coef[free] = np.linalg.solve(a[np.ix_(free, free)], rhs)
                low = free & (coef < floor)
                if not low.any():
                    break
                fixed |= low
            self._coef = tuple(float(c) for c in np.maximum(coef, floor) / self._scales)
        return self._coef


class EstimateTracker:
    """Moving ``Estimates``: the prior's shape, refitted from what was observed.

    Transfers fit ``seconds = latency + bytes / bandwidth`` per source; prefills fit
    ``seconds = overhead + token_s * new + pair_s * pairs`` (``PrefillEstimate``); decode fits
    seconds per generated token.

    Args:
        prior: the configured estimates (the starting point; also the fixed bytes per token).
        half_life: observations after which an observation's weight halves.
        prior_weight: how many observations the prior is worth at each typical size.
        typical_tokens: the typical prompt (and transfer) size in tokens, where the prior's
            pseudo-observations sit.
    """

    def __init__(self, prior: Estimates, *, half_life: float = 256.0, prior_weight: float = 1.0,
                 typical_tokens: int = 4096):
        self.prior = prior
        kw = {"half_life": half_life, "prior_weight": prior_weight}
        p, n = prior.prefill, float(max(typical_tokens, 1))
        # NOTE: (1, new, pairs) at a short prompt, a typical one, and a typical one after a
        # typical cached prefix: the three determine overhead, per-token and per-pair terms.
        points = [(1.0, m, (c + m) * (c + m + 1) / 2 - c * (c + 1) / 2)
                  for m, c in ((n / 16, 0.0), (n, 0.0), (n, 2 * n))]
        self._prefill = DecayedFit((p.overhead_s, p.token_s, p.pair_s), points, **kw)
        self._decode = DecayedFit((prior.decode_token_s,), [(1.0,)], **kw)
        typical_bytes = n * prior.bytes_per_token
        self._paths: dict[Source, DecayedFit] = {}
        for source, path in ((Source.STORE, prior.store), (Source.PEER, prior.peer)):
            if path is not None:
                self._paths[source] = DecayedFit(
                    (path.latency_s, 1.0 / path.bytes_per_s),
                    [(1.0, typical_bytes / 64), (1.0, typical_bytes)], **kw)
        self._snapshot: Estimates | None = prior

    def observe_prefill(self, num_new: int, num_cached: int, seconds: float) -> None:
        """One prefill pass of ``num_new`` tokens after ``num_cached`` took ``seconds``."""
        if num_new > 0:
            end = num_cached + num_new
            pairs = (end * (end + 1) - num_cached * (num_cached + 1)) / 2
            self._prefill.observe((1.0, float(num_new), pairs), seconds)
            self._snapshot = None

    def observe_load(self, source: Source, num_bytes: int, seconds: float) -> None:
        """One transfer of ``num_bytes`` from ``source`` took ``seconds`` (ignored for a
        source the prior has no path for)."""
        fit = self._paths.get(Source(source))
        if fit is not None and num_bytes > 0:
            fit.observe((1.0, float(num_bytes)), seconds)
            self._snapshot = None

    def observe_decode(self, num_tokens: int, seconds: float) -> None:
        """``num_tokens`` decode steps took ``seconds`` in all."""
        if num_tokens > 0:
            self._decode.observe((1.0,), seconds / num_tokens)
            self._snapshot = None

    def observe_linker(self, before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
        """Store loads between two ``ExternalCacheLinker.stats()`` snapshots: the change of
        ``loaded_bytes`` and of the ``load_seconds`` histogram's sum and count, as one mean
        load (the linker keeps no per-load byte counts)."""
        count = _hist(after, "count") - _hist(before, "count")
        if count > 0:
            num_bytes = int(after.get("loaded_bytes", 0)) - int(before.get("loaded_bytes", 0))
            seconds = _hist(after, "sum") - _hist(before, "sum")
            self.observe_load(Source.STORE, num_bytes // int(count), seconds / count)

    def snapshot(self) -> Estimates:
        """The current estimates (one frozen object until the next observation)."""
        if self._snapshot is None:
            overhead, token_s, pair_s = self._prefill.coefficients()
            paths: dict[Source, TransferEstimate] = {}
            for source, fit in self._paths.items():
                latency, s_per_byte = fit.coefficients()
                paths[source] = TransferEstimate(bytes_per_s=1.0 / s_per_byte, latency_s=latency)
            self._snapshot = Estimates(
                prefill=PrefillEstimate(token_s=token_s, pair_s=pair_s, overhead_s=overhead),
                bytes_per_token=self.prior.bytes_per_token, store=paths.get(Source.STORE),
                peer=paths.get(Source.PEER), decode_token_s=self._decode.coefficients()[0])
        return self._snapshot


def _hist(stats: Mapping[str, Any], key: str) -> float:
    value = stats.get("load_seconds")
    return float(value.get(key, 0)) if isinstance(value, Mapping) else 0.0
