"""``LinkerConfig``: the tunables of an ``ExternalCacheLinker`` as one frozen, validated record.

Owns defaults and range checks only; builds nothing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from radixlink.linker.breaker import BreakerConfig


class WritePolicy(str, enum.Enum):
    """When nodes are exported: on their first hit (the creating insert counts), on their
    N-th hit, or just before eviction frees their data."""

    WRITE_THROUGH = "write_through"
    WRITE_THROUGH_SELECTIVE = "write_through_selective"
    WRITE_BACK = "write_back"


WRITE_POLICIES = tuple(policy.value for policy in WritePolicy)

MAX_THREADS = 64
"""Most store transfer threads a linker starts (each is an OS thread with its own stack)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkerConfig:
    """How a linker behaves (``ExternalCacheLinker(cache, store, config=...)``, or the same
    names as keyword arguments).

    Attributes:
        write_policy: when nodes are offloaded: ``write_through`` (a node's first hit, its
            creating insert included), ``write_through_selective`` (its
            ``write_through_threshold``-th hit) or ``write_back`` (just before eviction frees
            any of its data).
        write_through_threshold: hits before a ``write_through_selective`` offload.
        max_inflight_bytes: offload bytes queued or in flight; past it offloads are dropped
            and counted.
        load_timeout_s: default per-request load deadline, counted from ``load()`` (slots are
            freed when the worker returns, never before).
        revalidate_after_s: a stored mark older than this is re-checked on the next hit, and
            an offload skips only pages confirmed more recently (0: it skips none).
        num_threads: store transfer threads, 1 to ``MAX_THREADS`` (64).
        breaker: the time budget and circuit breaker of store calls on the caller's thread.
        max_lookups, max_lookup_bytes, lookup_ttl_s: bounds on lookups remembered for
            ``load()`` (count, host bytes, age; the age bound is off with several ranks).
        max_known_pages: pages the stored index (``tree.stored``) holds beyond what the
            device pools hold; pages stay there after their nodes left the device, so a
            prefix inserted again is not written again. Past the bound the earliest confirmed
            go (their nodes are offloaded again on a later hit). 0: unbounded, and offloads
            skip no page.
    """

    write_policy: WritePolicy | str = WritePolicy.WRITE_THROUGH
    write_through_threshold: int = 2
    max_inflight_bytes: int = 256 << 20
    load_timeout_s: float = 30.0
    revalidate_after_s: float = 300.0
    num_threads: int = 2
    breaker: BreakerConfig | None = None
    max_lookups: int = 1 << 16
    max_lookup_bytes: int = 64 << 20
    lookup_ttl_s: float = 60.0
    max_known_pages: int = 1 << 18

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "write_policy", WritePolicy(self.write_policy))
        except ValueError:
            raise ValueError(f"write_policy must be one of {WRITE_POLICIES}, got "
                             f"{self.write_policy!r}") from None
        for name in ("load_timeout_s", "lookup_ttl_s"):
            if not _number(getattr(self, name)) or not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got "
                                 f"{getattr(self, name)!r}")
        if not _number(self.revalidate_after_s) or not self.revalidate_after_s >= 0:
            raise ValueError(f"revalidate_after_s must be >= 0 seconds, got "
                             f"{self.revalidate_after_s!r}")
        for name, low in (("write_through_threshold", 1), ("max_inflight_bytes", 1),
                          ("num_threads", 1), ("max_lookups", 1), ("max_lookup_bytes", 1),
                          ("max_known_pages", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if self.num_threads > MAX_THREADS:
            raise ValueError(f"num_threads={self.num_threads} is more than {MAX_THREADS} store "
                             "transfer threads; a store saturates long before (try 2-8)")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
