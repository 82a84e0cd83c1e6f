"""Store keys of the linker's pages, built from a precomputed ``<version>/<namespace>/`` prefix
and ``/<pool>[/r<rank>]`` suffix per (namespace, pool): one string join per page, no per-page
parsing or validation (``page_key`` validates each template once).

Owns the key templates. Must not touch the tree or stores.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from radixlink.contract import PoolName
from radixlink.hashing import namespace_id
from radixlink.stores.keys import page_key

_MAX_TEMPLATES = 4096  # (namespace, pool) pairs cached; then the cache starts over
_HOLE = "{}"


class StoreKeys:
    """Keys ``v<format>/<namespace id>/<page hash>/<pool>[/r<rank>]`` for a linker's pages.

    Args:
        rank: this process's tensor-parallel rank.
        replicated: whether a pool is identical on every rank (its keys carry no rank).
    """

    def __init__(self, rank: int, replicated: Callable[[PoolName], bool]):
        self.rank = rank
        self._replicated = replicated
        self._templates: dict[tuple[PoolName, Any], tuple[str, str]] = {}

    def keys(self, name: PoolName, namespace: Any, hashes: Sequence[str]) -> list[str]:
        """The store keys of pages ``hashes`` of pool ``name`` in the resolved ``namespace``."""
        template = self._templates.get((name, namespace))
        if template is None:
            template = self._template(name, namespace)
        head, tail = template
        return [head + h + tail for h in hashes]

    def _template(self, name: PoolName, namespace: Any) -> tuple[str, str]:
        rank = None if self._replicated(name) else self.rank
        head, tail = page_key(namespace_id(namespace), _HOLE, name, rank).split(_HOLE)
        if len(self._templates) >= _MAX_TEMPLATES:
            self._templates.clear()  # NOTE: bounded with unbounded tenants (cache salts)
        self._templates[(name, namespace)] = (head, tail)
        return head, tail
