"""``PageKeys``: the one key scheme of the page layer, for every adapter (the tree's linker,
SGLang's linker and HiCache backend, vLLM's scheduler and workers).

A page's key is ``v<format>/<namespace id>/<page hash>/<pool>[/r<rank>]`` (``stores.keys``
owns the format): one process's keys carry its tensor-parallel rank on every pool but the
replicated ones (identical on every rank, written by rank 0). The template of a (pool,
namespace) is built and checked once; the keys of a batch of pages are then one string join
and one split, whatever the count.

Owns the key bytes of a page and who writes it. Must not hash pages (the adapters name pages:
radixlink's chains, SGLang's or vLLM's own hashes) or open stores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from radixlink.contract import PoolName
from radixlink.hashing import namespace_id
from radixlink.stores.keys import page_key

_MAX_TEMPLATES = 4096  # (pool, namespace) templates cached; then the cache starts over
_HOLE = "{}"  # NOTE: a hash stand-in no namespace id (hex) or pool name contains
_SEP = "\n"  # NOTE: never in a hash (checked) or a template, so it splits joined keys apart
_OWN = object()  # ``keys()`` without a namespace: the one the ``PageKeys`` was made with


class PageKeys:
    """The store keys of one process's pages.

    Args:
        rank: this process's tensor-parallel rank.
        replicated: whether a pool is identical on every rank (its keys carry no rank; rank 0
            writes it), as a predicate or a set of pools.
        namespace: the namespace of ``keys`` calls that name none (a namespace id, or what
            ``hashing.namespace_id`` takes: None, a ``Namespace``, a tuple of parts).

    Raises:
        ValueError: a negative or non-int rank.
    """

    def __init__(self, rank: int = 0,
                 replicated: Callable[[PoolName], bool] | Iterable[PoolName] = (), *,
                 namespace: Any = None):
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            raise ValueError(f"rank must be a non-negative int, got {rank!r}")
        self.rank = rank
        self._replicated = replicated if callable(replicated) else \
            frozenset(replicated).__contains__
        self.namespace = namespace
        self._templates: dict[tuple[PoolName, Any], tuple[str, str]] = {}

    @property
    def namespace_id(self) -> str:
        """The id of the namespace keys are in when a call names none."""
        return _id(self.namespace)

    def rank_of(self, pool: PoolName) -> int | None:
        """The rank part of ``pool``'s keys (None: replicated)."""
        return None if self._replicated(pool) else self.rank

    def writes(self, pool: PoolName) -> bool:
        """Whether this rank writes ``pool`` (replicated pools: rank 0 only)."""
        return self.rank == 0 or not self._replicated(pool)

    def keys(self, pool: PoolName, hashes: Sequence[str], namespace: Any = _OWN) -> list[str]:
        """The keys of the pages ``hashes`` of ``pool`` in ``namespace`` (default: the one
        this ``PageKeys`` was made with): one join and one split, whatever the count.

        Raises:
            ValueError: a hash that is empty or holds ``/`` or a line break (engines name
                pages with their own hashes), a bad namespace id or pool.
        """
        if not hashes:
            return []
        joined = "".join(hashes)
        if "/" in joined or _SEP in joined or not all(hashes):
            bad = next(h for h in hashes if not h or "/" in h or _SEP in h)
            raise ValueError(f"page hash {bad!r} must be non-empty hex without '/'")
        head, tail = self.template(pool, namespace)
        return (head + (tail + _SEP + head).join(hashes) + tail).split(_SEP)

    def template(self, pool: PoolName, namespace: Any = _OWN) -> tuple[str, str]:
        """The key prefix and suffix of ``pool``'s pages in ``namespace``: a page's key is
        ``prefix + hash + suffix``."""
        if namespace is _OWN:
            namespace = self.namespace
        template = self._templates.get((pool, namespace))
        if template is None:
            head, tail = page_key(_id(namespace), _HOLE, pool, self.rank_of(pool)).split(_HOLE)
            if len(self._templates) >= _MAX_TEMPLATES:
                self._templates.clear()  # NOTE: bounded with unbounded tenants (cache salts)
            template = self._templates[(pool, namespace)] = (head, tail)
        return template


def _id(namespace: Any) -> str:
    return namespace if isinstance(namespace, str) else namespace_id(namespace)
