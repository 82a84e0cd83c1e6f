"""Store keys: ``<format version>/<namespace id>/<page hash hex>/<pool>[/r<rank>]``.

Owns building and parsing keys. Keys hold only hashes, never token ids; stores treat them as
opaque strings.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlink.contract import PoolName
from radixlink.stores.pageformat import FORMAT_VERSION

KEY_PREFIX = f"v{FORMAT_VERSION}/"
DEFAULT_NAMESPACE = "_"  # the namespace id used when a cache has no namespace parts
_POOLS = {pool.value: pool for pool in PoolName}


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyParts:
    """The fields of a parsed store key."""

    version: int
    namespace_id: str
    page_hash: str
    pool: PoolName
    rank: int | None = None


def page_key(
    namespace_id: str, page_hash: str, pool: PoolName | str, rank: int | None = None
) -> str:
    """The store key of one page of one pool.

    Args:
        namespace_id: hex id of the namespace (model, layout, salt, extra key); ``""`` maps to
            the default namespace ``_``.
        page_hash: hex hash of the page chain ending at this page.
        pool: the pool the page belongs to (``PoolName`` or its value).
        rank: the tensor-parallel rank, for pools that differ per rank; None otherwise.

    Raises:
        ValueError: a part contains ``/``, the hash is empty, or the pool or rank is invalid.
    """
    pool_value = pool.value if isinstance(pool, PoolName) else pool
    if pool_value not in _POOLS:
        raise ValueError(f"unknown pool {pool!r}; expected one of {sorted(_POOLS)}")
    if not page_hash or "/" in page_hash or "/" in namespace_id:
        raise ValueError(
            f"key parts must be non-empty hex without '/': namespace={namespace_id!r} "
            f"page_hash={page_hash!r}"
        )
    key = f"{KEY_PREFIX}{namespace_id or DEFAULT_NAMESPACE}/{page_hash}/{pool_value}"
    if rank is None:
        return key
    if not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be a non-negative int or None, got {rank!r}")
    return f"{key}/r{rank}"


def parse_key(key: str) -> KeyParts | None:
    """The parts of a radixlink key, or None when ``key`` is not one (foreign data)."""
    parts = key.split("/")
    if len(parts) not in (4, 5) or not parts[0].startswith("v") or not parts[0][1:].isdigit():
        return None
    pool = _POOLS.get(parts[3])
    if pool is None or not parts[1] or not parts[2]:
        return None
    rank = None
    if len(parts) == 5:
        if not parts[4].startswith("r") or not parts[4][1:].isdigit():
            return None
        rank = int(parts[4][1:])
    return KeyParts(
        version=int(parts[0][1:]), namespace_id=parts[1], page_hash=parts[2], pool=pool, rank=rank
    )


def is_page_key(key: str) -> bool:
    """Whether ``key`` is a radixlink page key (the only keys radixlink may delete)."""
    return key.isascii() and parse_key(key) is not None


def namespace_of(key: str) -> str | None:
    """The namespace id of a radixlink key, or None for a foreign key."""
    parts = parse_key(key)
    return parts.namespace_id if parts is not None else None
