"""Store keys for pages SGLang names: ``v4/<namespace id>/<engine page hash>/<pool>[/r<rank>]``.

Owns which namespace, layout and rank parts a page's key carries. The page hash is SGLang's own
(never re-hashed here); the key bytes are the page layer's ``PageKeys``. Must not
import SGLang or touch stores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from radixlink.contract import PoolName
from radixlink.hashing import Namespace
from radixlink.pages.keys import PageKeys


@dataclass(frozen=True, slots=True, kw_only=True)
class KeySpace:
    """How one engine process names its pages in the store.

    Attributes:
        namespace_id: id of (namespace, layout of every pool, pipeline stage); two processes
            share pages only when all of these match.
        rank: the tensor-parallel rank, for pools whose pages differ per rank.
        replicated: pools identical on every rank (MLA KV): no rank part, one writer.
    """

    namespace_id: str
    rank: int
    replicated: frozenset[PoolName]
    _keys: PageKeys = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_keys", PageKeys(self.rank, self.replicated,
                                                   namespace=self.namespace_id))

    @classmethod
    def create(
        cls, *, namespace: str, layout: str, rank: int, replicated: frozenset[PoolName]
    ) -> KeySpace:
        """Build the key space; ``layout`` is the combined fingerprint of the pools."""
        if rank < 0:
            raise ValueError(f"rank must be >= 0, got {rank}")
        ns = Namespace(model=namespace, layout=layout)
        return cls(namespace_id=ns.id, rank=rank, replicated=replicated)

    def keys(self, hashes: Sequence[str], pool: PoolName) -> list[str]:
        """The store key of each engine page hash of ``pool``, in order."""
        return self._keys.keys(pool, hashes)

    def writes(self, pool: PoolName) -> bool:
        """Whether this rank writes ``pool`` (replicated pools: rank 0 only)."""
        return self._keys.writes(pool)
