"""``BadKeys``: the keys found bad here (the one corrupt-page policy's record, ``pageio``).

Owns the bounded, thread-safe set and what it changes: presence masked (a failed delete still
reads absent), a skip-present writer still writing them. Knows nothing of stores or codecs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

_MAX_BAD_KEYS = 1 << 16  # bad keys remembered until rewritten; then the set starts over


class BadKeys:
    """Keys found bad here (deleted from the store) and not rewritten since: a writer that
    skips pages the store reports present still writes these. Bounded; thread-safe. (SGLang's
    linker keeps the keys its lookups found stored but never read in one too.)"""

    def __init__(self, capacity: int = _MAX_BAD_KEYS) -> None:
        self._keys: set[str] = set()
        self._capacity = capacity
        self._lock = threading.Lock()

    def add(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        with self._lock:
            if len(self._keys) + len(keys) > self._capacity:
                self._keys.clear()  # NOTE: bounded memory; a forgotten key heals later
            self._keys.update(keys)

    def discard(self, keys: Iterable[str]) -> list[str]:
        """Forget ``keys`` (rewritten); the ones that were bad."""
        if not self._keys:
            return []
        with self._lock:
            healed = [k for k in keys if k in self._keys]
            self._keys.difference_update(healed)
        return healed

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def mask(self, keys: Sequence[str], flags: Sequence[bool]) -> list[bool]:
        """``flags`` with every bad key's flag cleared (a failed delete still reads absent)."""
        if not self._keys:
            return list(flags)
        with self._lock:
            return [ok and key not in self._keys for key, ok in zip(keys, flags)]
