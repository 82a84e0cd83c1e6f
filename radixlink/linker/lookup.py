"""LOOKUP: what a lookup found (``Lookup``), hashes of a request's device-uncached tail, which
prefix lengths the store can restore (through the page layer's restore rule), the
bounded memory of lookups that ``load()`` may still claim. The tail's page hashes go down into
the tree's ``PageHashMemo`` for the insert of the same tokens.

Owns no tree state; reads the tree only through a ``MatchResult``, and the linker only through
its explicit ``LinkerParts`` (the pools a load brings: name, hit policy, window). Store presence
comes through the parts' ``StoreGuard`` (time budget + circuit breaker): a failed, skipped or
slow store is a miss.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from radixlink.contract import MatchResult
from radixlink.cost import choose_load_pages
from radixlink.hashing import key_hashes
from radixlink.linker.parts import LinkerParts
from radixlink.pages.restore import restorable_prefix_pages, split_presence
from radixlink.tokens import TOKEN_BYTES


@dataclass(slots=True, kw_only=True)
class Lookup:
    """What ``match_prefix(req_id=...)`` found in the store for one request.

    ``keys`` are the chained page hashes of the restorable tail (``num_pages`` of them),
    page 0 = first device-uncached page; ``namespace`` is the resolved (layered) one.
    """

    tokens: Any  # numpy uint32 copy of the whole-page key, [0, prefix_len + num_pages * ps)
    prefix_len: int
    last_node: Any
    keys: list[str]
    namespace: Any = None
    created: float = 0.0  # time.monotonic() of the lookup
    # the device match's full slots of [0, prefix_len), valid while the tree's epoch is still
    # ``epoch`` (nothing tree-owned freed since: the match holds as it was)
    device_slots: Any = None
    epoch: int = -1

    @property
    def num_pages(self) -> int:
        return len(self.keys)

    @property
    def num_bytes(self) -> int:
        """Host memory this lookup pins while remembered (tokens, key strings, slots)."""
        slots = 0 if self.device_slots is None else 8 * int(self.device_slots.numel())
        return int(self.tokens.nbytes) + sum(map(len, self.keys)) + 49 * len(self.keys) + slots

    @property
    def signature(self) -> tuple[str, int, int]:
        """Identifies the pages and where they start: the last chained hash names the whole
        prefix (namespace included)."""
        return (self.keys[-1], len(self.keys), self.prefix_len)


def restorable_pages(parts: LinkerParts, keys: list[str], namespace: Any) -> list[int]:
    """Every tail length (pages) this rank can restore, from one presence batch over the
    pools a load brings; a failed or skipped store is none. Pages found absent leave the
    stored index (the store evicted them: they are written again), but only while the index
    lets offloads skip pages (with several ranks the lookups differ per rank, and the index
    is fed by agreed events only)."""
    rules, keyspace = parts.pools, parts.keyspace
    if not rules:
        return []
    store_keys = keyspace.keys(rules[0].name, keys, namespace)
    for rule in rules[1:]:
        store_keys += keyspace.keys(rule.name, keys, namespace)
    guard = parts.guard
    exists = guard.exists(store_keys)
    if exists is None:
        parts.stats["lookups_skipped" if guard.last_skipped else "failures_lookup"] += 1
        return []
    pools = split_presence(rules, exists, [len(keys)] * len(rules))
    if parts.stored.enabled and not all(exists):
        for pool in pools:
            parts.stored.discard(pool.name, [h for h, hit in zip(keys, pool.present) if not hit])
    return restorable_prefix_pages(len(keys), pools).restorable_prefix_pages


def find_restorable(parts: LinkerParts, result: MatchResult, key: bytes,
                    namespace: Any) -> Lookup | None:
    """What the store can restore after the device match ``result`` of ``key`` (packed uint32
    tokens) in the resolved ``namespace``, agreed across ranks (a collective when there are
    whole pages to look up), or None. The tail's hashes go into the tree's memo
    (``parts.hash_memo``) for the insert of the same tokens that follows.
    """
    ps, prefix = parts.page_size, result.prefix_len
    tokens = np.frombuffer(key, dtype="<u4")
    num_pages = len(tokens) // ps - prefix // ps
    if num_pages <= 0:
        return None
    # NOTE: the chain continues at the page where the match ended (an empty match: the seed)
    after = None if prefix == 0 else result.last_node.hash_value[result.node_offset // ps - 1]
    keys = key_hashes(key[prefix * TOKEN_BYTES : len(tokens) // ps * ps * TOKEN_BYTES], ps,
                      parts.cache.config.hash_algo, namespace=namespace, parent=after)
    # NOTE: the insert of these tokens that follows reuses the hashes (hashed once per page)
    parts.hash_memo.remember(namespace, key, prefix // ps, keys)
    pages = restorable_pages(parts, keys, namespace)
    common = pages if parts.world_size == 1 else parts.ranks.intersect(pages, num_pages)
    if parts.cost_model is None:  # NOTE: no model: the largest, as worth_loading says
        best = max(common, default=0)
    else:
        best = worth_loading(parts, common, prefix)
    if not best:
        return None
    # NOTE: a copy of just the restorable prefix, so a remembered lookup never pins the
    # caller's whole packed prompt.
    return Lookup(tokens=tokens[: prefix + best * ps].copy(), prefix_len=prefix,
                  last_node=result.last_node, keys=keys[:best], namespace=namespace,
                  created=time.monotonic(), device_slots=result.device_indices,
                  epoch=parts.cache.tree.epoch)


def worth_loading(parts: LinkerParts, common: list[int], prefix: int) -> int:
    """Of the restorable tail lengths every rank has, the one to load: the largest, or with a
    cost model the one that minimises the expected TTFT (possibly shorter, or 0 = none),
    agreed across ranks (a collective with several ranks; ``common`` is the same on all)."""
    most = max(common, default=0)
    model = parts.cost_model
    if not most or model is None:
        return most
    best = choose_load_pages(common, device_len=prefix, page_size=parts.page_size,
                             bytes_per_token=parts.bytes_per_token, estimates=model.snapshot())
    if parts.world_size > 1:
        best = parts.ranks.agree_count(best)  # MIN: each rank's answer is in common, or 0
    if best < most:
        parts.stats["cost_declined_loads" if best == 0 else "cost_shortened_loads"] += 1
        parts.stats["cost_declined_pages"] += most - best
    return best


class RememberedLookups:
    """Lookups that ``load(req_id)`` may still claim, bounded by count, bytes and age (engines
    may look up and never load). The oldest go first past a bound.

    Args:
        max_count: lookups kept at most.
        max_bytes: host bytes (tokens + keys) they may pin together.
        ttl_s: age after which a lookup is dropped (None: no age bound; with several ranks
            the clocks differ, so the linker passes None there and the bounds stay
            deterministic).
        clock: the time source (tests inject one).
    """

    def __init__(self, max_count: int, max_bytes: int, ttl_s: float | None,
                 clock: Callable[[], float] = time.monotonic):
        for name, value in (("max_count", max_count), ("max_bytes", max_bytes)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"remembered lookups: {name} must be a positive int, got "
                                 f"{value!r}")
        if ttl_s is not None and not ttl_s > 0:
            raise ValueError(f"remembered lookups: ttl_s must be positive or None, got {ttl_s!r}")
        self.max_count, self.max_bytes, self.ttl_s = max_count, max_bytes, ttl_s
        self._clock = clock
        self._items: OrderedDict[Any, Lookup] = OrderedDict()
        self._bytes = 0
        self.num_dropped = 0

    def put(self, req_id: Any, lookup: Lookup | None) -> None:
        """Remember ``lookup`` for ``req_id`` (None forgets a previous one)."""
        previous = self._items.pop(req_id, None)
        if previous is not None:
            self._bytes -= previous.num_bytes
        if lookup is None:
            return
        self._items[req_id] = lookup
        self._bytes += lookup.num_bytes
        self._trim()

    def pop(self, req_id: Any) -> Lookup | None:
        """The lookup of ``req_id`` (forgotten now), or None (never, dropped or expired)."""
        self._trim()
        lookup = self._items.pop(req_id, None)
        if lookup is not None:
            self._bytes -= lookup.num_bytes
        return lookup

    def drop(self, req_id: Any) -> bool:
        """Forget the lookup of ``req_id``; whether there was one."""
        lookup = self._items.pop(req_id, None)
        if lookup is None:
            return False
        self._bytes -= lookup.num_bytes
        return True

    def _trim(self) -> None:
        oldest = None if self.ttl_s is None else self._clock() - self.ttl_s
        while self._items:
            first = next(iter(self._items.values()))
            if (len(self._items) <= self.max_count and self._bytes <= self.max_bytes
                    and (oldest is None or first.created > oldest)):
                return
            _, lookup = self._items.popitem(last=False)
            self._bytes -= lookup.num_bytes
            self.num_dropped += 1

    def __len__(self) -> int:
        return len(self._items)

    def stats(self) -> dict[str, int]:
        return {"lookups_remembered": len(self._items), "lookup_bytes_remembered": self._bytes,
                "lookups_dropped": self.num_dropped}
