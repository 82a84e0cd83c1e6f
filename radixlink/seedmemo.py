"""``NamespaceMemo``: a bounded memo of namespace seeds and ids for ``hashing``.

Owns the memo only (no hashing, no radixlink imports): bounded by entries and by the size of
the namespace parts its keys keep alive.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any


class NamespaceMemo:
    """Namespace seeds and ids already computed, bounded by entries and by the characters of
    the namespace parts they keep alive (a request's salt can be any size: an unbounded key
    would pin it). Parts longer than ``max_key_chars`` are hashed on every call instead.

    Args:
        max_entries: entries kept at most (least recently used go first).
        max_chars: namespace characters the kept keys may hold together.
        max_key_chars: the longest key (all parts together) that is kept.
    """

    def __init__(self, max_entries: int = 1024, max_chars: int = 1 << 20,
                 max_key_chars: int = 4096):
        self.max_entries, self.max_chars, self.max_key_chars = (max_entries, max_chars,
                                                                max_key_chars)
        self._items: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._sizes: dict[tuple[Any, ...], int] = {}
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...], parts: tuple[str, ...], make: Callable[[], Any]) -> Any:
        """The memoised value of ``key`` (whose namespace parts are ``parts``), made now by
        ``make`` when absent."""
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
                return value
        value = make()
        size = sum(map(len, parts))
        if size > self.max_key_chars:  # NOTE: too large to keep: hashed again next time
            return value
        with self._lock:
            if key not in self._items:
                self._items[key] = value
                self._sizes[key] = size
                self._chars += size
            while len(self._items) > self.max_entries or self._chars > self.max_chars:
                old, _ = self._items.popitem(last=False)
                self._chars -= self._sizes.pop(old)
        return value

    def info(self) -> dict[str, int]:
        """``entries`` kept and the namespace ``chars`` their keys hold."""
        with self._lock:
            return {"entries": len(self._items), "chars": self._chars}
