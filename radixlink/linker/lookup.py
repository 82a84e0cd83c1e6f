"""LOOKUP: hashes of a request's device-uncached tail and which prefix lengths the store can
restore (through the one pure rule in ``restorable.py``).

Owns nothing stateful; reads the tree only through a ``MatchResult`` and component hooks.
A store failure of any kind (``StoreError``, or an ``OSError`` a backend let through) is a miss.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from radixlink.contract import LinkerTransferPhase, MatchResult, PoolTransfer
from radixlink.errors import StoreError
from radixlink.hashing import page_hashes
from radixlink.linker.records import Lookup
from radixlink.linker.restorable import presence_from_store, restorable_prefix_pages


def tail_hashes(cache: Any, result: MatchResult, tokens: np.ndarray, namespace: Any) -> list[str]:
    """Chained hashes of the whole pages of ``tokens`` after the device match, continuing the
    chain of the page where the match ended (or the namespace seed for an empty match)."""
    ps, prefix = cache.page_size, result.prefix_len
    tail = tokens[prefix : len(tokens) // ps * ps]
    algo = cache.config.hash_algo
    if prefix == 0:
        return page_hashes(tail, ps, namespace, algo=algo)
    parent = result.last_node.hash_value[result.node_offset // ps - 1]
    return page_hashes(tail, ps, parent=parent, algo=algo)


def lookup_transfers(components: Any, keys: list[str]) -> list[PoolTransfer]:
    """Every taking-part component's LOOKUP transfer for ``keys``."""
    out = []
    for component in components:
        transfer = component.build_external_linker_transfer(LinkerTransferPhase.LOOKUP, None, keys)
        if transfer is not None:
            out.append(transfer)
    return out


def restorable_pages(linker: Any, keys: list[str], namespace: Any) -> list[int]:
    """Every tail length (pages) this rank can restore; a store error is a miss (counted)."""
    components = linker.cache.components
    transfers = lookup_transfers(components, keys)
    if not transfers:
        return []
    store_keys = [k for t in transfers for k in linker.store_keys(t, namespace)]
    try:
        exists = linker.store.exists(store_keys)
    except (StoreError, OSError):
        linker.count("failures_lookup")
        return []
    windows = {c.pool_name: c.window_pages for c in components if c.window_pages > 0}
    presence = presence_from_store(transfers, exists, window_pages=windows)
    return restorable_prefix_pages(len(keys), presence).restorable_prefix_pages


def find_restorable(linker: Any, result: MatchResult, key: bytes, namespace: Any) -> Lookup | None:
    """What the store can restore after the device match ``result`` of ``key`` (packed uint32
    tokens), agreed across ranks (a collective when there are whole pages to look up), or None.
    """
    ps, prefix = linker.page_size, result.prefix_len
    tokens = np.frombuffer(key, dtype="<u4")
    num_pages = len(tokens) // ps - prefix // ps
    if num_pages <= 0:
        return None
    own = linker.cache.config.namespace if namespace is None else namespace
    keys = tail_hashes(linker.cache, result, tokens, own)
    pages = restorable_pages(linker, keys, namespace)
    best = max(linker.ranks.intersect(pages, num_pages), default=0)
    if not best:
        return None
    return Lookup(tokens=tokens[: prefix + best * ps], prefix_len=prefix,
                  last_node=result.last_node, keys=keys[:best], namespace=namespace)
