"""``faults://?inner=<url>&fail=0.2&corrupt=0.05&...``: seeded fault injection around a store.

Owns only the injected faults; every real operation goes to the inner store. For tests and
chaos runs; the knobs are plain attributes that tests may change at any time.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from radixlink.errors import StoreError
from radixlink.stores.base import Store
from radixlink.stores.params import AUTH, Param, integer, number, read_params, text
from radixlink.stores.registry import open_store, split_url

OPS = ("exists", "get", "put", "delete")
_FLOAT_PARAMS = ("fail", "corrupt", "truncate", "delay_ms", "enospc")
_PROBABILITY = "a probability from 0 to 1"


def _ops(value: str) -> tuple[str, ...]:
    ops = tuple(op for op in value.split(",") if op)
    if not ops or set(ops) - set(OPS):
        raise ValueError(value)
    return ops


PARAMS = {
    "inner": Param(text, None, "a percent-encoded store URL"),
    "seed": Param(integer(0), 0, "an int >= 0"),
    "ops": Param(_ops, ("exists", "get", "put"), f"a comma list of {', '.join(OPS)}"),
    "fail": Param(number(0.0, 1.0), 0.0, _PROBABILITY),
    "corrupt": Param(number(0.0, 1.0), 0.0, _PROBABILITY),
    "truncate": Param(number(0.0, 1.0), 0.0, _PROBABILITY),
    "enospc": Param(number(0.0, 1.0), 0.0, _PROBABILITY),
    "delay_ms": Param(number(0.0, 3_600_000.0), 0.0, "milliseconds from 0 to 3600000"),
    "auth": AUTH,
}


class InjectedFault(OSError):
    """The cause attached to an injected ``StoreError`` (so tests can tell it apart)."""


class FaultyStore(Store):
    """Wraps ``inner`` and, with a seeded RNG, injects faults:

    - ``fail``: probability that a call to one of ``ops`` raises ``StoreError``;
    - ``corrupt`` / ``truncate``: per returned page of ``get``, probability of flipping a
      byte / cutting the value short (the codec must catch both);
    - ``delay_ms``: latency added to every call of ``ops``;
    - ``enospc``: per page of ``put``, probability that it is not stored (False, counted).

    Args:
        inner: the wrapped store (owned: closed by ``close``).
        seed: RNG seed; the same seed and call sequence give the same faults.
        ops: the operations ``fail`` and ``delay_ms`` apply to.
    """

    def __init__(
        self,
        inner: Store,
        *,
        fail: float = 0.0,
        corrupt: float = 0.0,
        truncate: float = 0.0,
        delay_ms: float = 0.0,
        enospc: float = 0.0,
        seed: int = 0,
        ops: Sequence[str] = ("exists", "get", "put"),
    ):
        unknown = sorted(set(ops) - set(OPS))
        if unknown:
            raise ValueError(f"unknown ops {unknown}; choose from {OPS}")
        for name, value in (("fail", fail), ("corrupt", corrupt), ("truncate", truncate),
                            ("enospc", enospc)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value!r} is not a probability from 0 to 1")
        if not delay_ms >= 0.0:
            raise ValueError(f"delay_ms={delay_ms!r} must be >= 0")
        self.inner = inner
        self.fail, self.corrupt, self.truncate = fail, corrupt, truncate
        self.delay_ms, self.enospc = delay_ms, enospc
        self.ops = frozenset(ops)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._counts = {"failed_calls": 0, "corrupted": 0, "truncated": 0, "enospc": 0}

    @classmethod
    def from_url(cls, url: str, *, read_only: bool = False) -> FaultyStore:
        """``faults://?inner=<url-encoded url>&fail=0.2&corrupt=0.05&truncate=0&delay_ms=20
        &enospc=0&seed=1&ops=exists,get,put``; the page secret is ``auth=`` or the inner's."""
        scheme, _, params = split_url(url)
        options = read_params(scheme, params, PARAMS)
        if options["inner"] is None:
            raise ValueError("faults:// store URL needs inner=<percent-encoded store URL>")
        knobs = {name: options[name] for name in _FLOAT_PARAMS}
        inner = open_store(options["inner"], read_only=read_only)
        store = cls(inner, seed=options["seed"], ops=options["ops"], **knobs)
        store._page_secret = options["auth"]
        return store

    @property
    def page_secret(self) -> bytes | None:
        """The URL's ``auth=`` when given, else the inner store's."""
        return self._page_secret or self.inner.page_secret

    @property
    def shared(self) -> bool:  # type: ignore[override]
        """Whether other processes reach the inner store."""
        return self.inner.shared

    @property
    def scatters(self) -> bool:  # type: ignore[override]
        """As the inner store (reads go through ``get``, damaged, either way)."""
        return self.inner.scatters

    def exists(self, keys: Sequence[str]) -> list[bool]:
        self._before("exists")
        return self.inner.exists(keys)

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        self._before("get")
        return [self._damage(value) for value in self.inner.get(keys)]

    def put(self, items: Mapping[str, bytes]) -> list[bool]:
        self._before("put")
        with self._lock:
            refused = {key for key in items if self._rng.random() < self.enospc}
            self._counts["enospc"] += len(refused)
        stored = self.inner.put({k: v for k, v in items.items() if k not in refused})
        results = iter(stored)
        return [False if key in refused else next(results) for key in items]

    def delete(self, keys: Sequence[str]) -> int:
        self._before("delete")
        return self.inner.delete(keys)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            counts = dict(self._counts)
        return {**self.inner.stats(), "faults": counts}

    def scan(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        return self.inner.scan(prefix)

    def gc(self) -> int:
        return self.inner.gc()

    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()

    def _before(self, op: str) -> None:
        if op not in self.ops:
            return
        if self.delay_ms > 0:
            time.sleep(self.delay_ms / 1000.0)
        with self._lock:
            failed = self._rng.random() < self.fail
            self._counts["failed_calls"] += failed
        if failed:
            raise StoreError(f"injected failure in {op}") from InjectedFault(op)

    def _damage(self, value: bytes | None) -> bytes | None:
        if value is None or not value:
            return value
        with self._lock:
            corrupt = self._rng.random() < self.corrupt
            truncate = self._rng.random() < self.truncate
            where = self._rng.randrange(len(value))
            self._counts["corrupted"] += corrupt
            self._counts["truncated"] += truncate
        if corrupt:
            value = b"".join((value[:where], bytes([value[where] ^ 0xFF]), value[where + 1 :]))
        if truncate:
            value = value[:where]
        return value
