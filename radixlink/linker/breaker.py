"""Store calls on the engine's thread under a time budget and a circuit breaker: a paused or
failing store costs a request at most the budget, and after a few failures none at all until a
jittered cool-down lets one probe through (docs/reliability.md, "Hung store").

Owns the breaker state machine and the lookup thread. Must not touch the tree or the worker.
"""

from __future__ import annotations

import enum
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any


class BreakerState(str, enum.Enum):
    """CLOSED: calls go through. OPEN: calls are skipped until the cool-down ends.
    HALF_OPEN: one probe call is in flight; its result closes or re-opens the breaker."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerConfig:
    """How the breaker reacts.

    Attributes:
        budget_s: longest an engine-thread store call may take; past it the call counts as
            failed and the caller goes on (the call itself finishes in the background).
        failure_threshold: consecutive failures (errors or budget overruns) that open it.
        cooldown_s: first open period; each failed probe doubles it, up to ``max_cooldown_s``.
        max_cooldown_s: longest open period.
        jitter: the open period is scaled by a random factor in ``[1 - jitter, 1 + jitter]``
            so that many engines do not probe a recovering store at the same instant.
    """

    budget_s: float = 0.25
    failure_threshold: int = 3
    cooldown_s: float = 1.0
    max_cooldown_s: float = 30.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        for name in ("budget_s", "cooldown_s", "max_cooldown_s"):
            value = getattr(self, name)
            if (not isinstance(value, (int, float)) or isinstance(value, bool)
                    or not 0 < value < math.inf):
                raise ValueError(f"BreakerConfig.{name} must be a positive, finite number of "
                                 f"seconds, got {value!r}")
        if not isinstance(self.failure_threshold, int) or self.failure_threshold < 1:
            raise ValueError(f"BreakerConfig.failure_threshold must be an int >= 1, got "
                             f"{self.failure_threshold!r}")
        if not isinstance(self.jitter, (int, float)) or not 0 <= self.jitter < 1:
            raise ValueError(f"BreakerConfig.jitter must be in [0, 1), got {self.jitter!r}")


class CircuitBreaker:
    """CLOSED -> OPEN after ``failure_threshold`` consecutive failures; OPEN -> HALF_OPEN when
    the (jittered, doubling) cool-down ends; HALF_OPEN -> CLOSED on a successful probe, back to
    OPEN on a failed one. ``clock`` and ``rng`` are injectable for tests.
    """

    def __init__(self, config: BreakerConfig | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None):
        self.config = config or BreakerConfig()
        self._clock = clock
        self._rng = rng or random.Random()
        self.state = BreakerState.CLOSED
        self._failures = 0
        self._cooldown = self.config.cooldown_s
        self._reopen_at = 0.0
        self.num_opens = 0
        self.num_short_circuits = 0

    def allow(self) -> bool:
        """Whether a call may go to the store now (an OPEN breaker past its cool-down lets
        exactly one probe through and turns HALF_OPEN)."""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN and self._clock() >= self._reopen_at:
            self.state = BreakerState.HALF_OPEN
            return True
        self.num_short_circuits += 1
        return False

    def record_success(self) -> None:
        self.state = BreakerState.CLOSED
        self._failures = 0
        self._cooldown = self.config.cooldown_s

    def record_failure(self) -> None:
        if self.state is BreakerState.HALF_OPEN:
            self._cooldown = min(2 * self._cooldown, self.config.max_cooldown_s)
            self._open()
            return
        self._failures += 1
        if self.state is BreakerState.CLOSED and self._failures >= self.config.failure_threshold:
            self._open()

    def _open(self) -> None:
        jitter = self.config.jitter
        self._reopen_at = self._clock() + self._cooldown * self._rng.uniform(1 - jitter,
                                                                            1 + jitter)
        self.state = BreakerState.OPEN
        self._failures = 0
        self.num_opens += 1

    def stats(self) -> dict[str, Any]:
        return {"store_breaker_state": self.state.value,
                "store_breaker_open": int(self.state is not BreakerState.CLOSED),
                "store_breaker_opens": self.num_opens,
                "store_breaker_short_circuits": self.num_short_circuits}


class StoreGuard:
    """Runs a store's ``exists`` for the engine's thread within the breaker's budget.

    The call runs on one background thread, so a hung store (a paused Redis, a stuck mount)
    blocks that thread, never the engine: the engine waits at most ``budget_s``. While a
    timed-out call is still stuck, further calls do not queue behind it: they fail at once.

    Args:
        store: the store (anything with ``exists(keys) -> list[bool]``).
        breaker: the breaker deciding whether to call at all.
    """

    def __init__(self, store: Any, breaker: CircuitBreaker):
        self.store = store
        self.breaker = breaker
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="radixlink-lookup")
        self._stuck: Future[Any] | None = None
        self._lock = threading.Lock()
        self.num_failures = 0  # errors and budget overruns, each a miss
        self.num_timeouts = 0  # budget overruns (a call still stuck counts again)
        self.last_skipped = False  # the last call was not made: the breaker is open

    def exists(self, keys: Sequence[str]) -> list[bool] | None:
        """Per-key presence, or None when the store was skipped, failed or overran the budget
        (the caller counts a miss). Never raises: any exception of the store is a failure."""
        self.last_skipped = not self.breaker.allow()
        if self.last_skipped:
            return None
        with self._lock:
            stuck = self._stuck is not None and not self._stuck.done()
            future = None if stuck else self._pool.submit(self.store.exists, list(keys))
        if future is None:
            self._failed(timeout=True)
            return None
        try:
            present = future.result(timeout=self.breaker.config.budget_s)
        except FutureTimeout:
            with self._lock:
                self._stuck = future
            self._failed(timeout=True)
            return None
        except Exception:  # noqa: BLE001 - any store failure is a miss, never the engine's error
            self._failed(timeout=False)
            return None
        if len(present) != len(keys):
            self._failed(timeout=False)
            return None
        self.breaker.record_success()
        return list(present)

    def _failed(self, *, timeout: bool) -> None:
        self.num_failures += 1
        self.num_timeouts += timeout
        self.breaker.record_failure()

    def stats(self) -> dict[str, Any]:
        out = self.breaker.stats()
        out["store_call_failures"] = self.num_failures
        out["store_call_timeouts"] = self.num_timeouts
        return out

    def close(self) -> None:
        """Stop the lookup thread without waiting for a call stuck in the store."""
        self._pool.shutdown(wait=False, cancel_futures=True)
