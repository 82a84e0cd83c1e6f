"""``NoPrefixCache``: the ``UnifiedCache`` contract with prefix caching off (the cache-off run).

Owns an allocator and nothing else: match always misses, insert frees the caller's pages.
"""

from __future__ import annotations

from typing import Any

import torch

from radixlink.cache import _check_insert, _check_slots
from radixlink.config import CacheConfig
from radixlink.contract import InsertParams, InsertResult, MatchResult, PoolName
from radixlink.memory.allocator import PagedAllocator
from radixlink.memory.pools import KVPool
from radixlink.tree.keys import token_bytes
from radixlink.tree.node import LockHandle, TreeNode


class NoPrefixCache:
    """Same methods as ``UnifiedCache``; nothing is ever cached.

    ``match_prefix`` returns an empty prefix ending at a root node, ``lock`` of that root is a
    no-op receipt (unlocking twice still raises), ``insert`` frees ``value`` beyond
    ``prev_prefix_len`` (which must be 0: there is nothing to have matched) and ``evict``
    frees nothing.

    Args:
        config: as for ``UnifiedCache``; hashing and eviction options are ignored.
    """

    def __init__(self, config: CacheConfig):
        if not isinstance(config, CacheConfig):
            raise ValueError(f"NoPrefixCache needs a CacheConfig, got {type(config).__name__}")
        self.config = config
        self.page_size = config.page_size
        self.device = torch.device(config.device)
        self._allocator = PagedAllocator(config.num_tokens, config.page_size, self.device)
        self._kv_pool = (
            None
            if config.kv_layout is None
            else KVPool(config.kv_layout, self._allocator.num_slots, self.device)
        )
        self._root = TreeNode(0, b"", None, 1)
        self._empty = torch.empty(0, dtype=torch.int64, device=self.device)
        self._num_held = 0
        self._next_handle = 0
        self._live: set[int] = set()
        self._counters = {"match_calls": 0, "match_tokens": 0, "insert_calls": 0}

    def match_prefix(
        self, tokens: Any, req_id: Any = None, *, namespace: Any = None
    ) -> MatchResult:
        """Always an empty match (``tokens`` is still validated)."""
        num = len(token_bytes(tokens)) >> 2
        self._counters["match_calls"] += 1
        self._counters["match_tokens"] += num
        return MatchResult(device_indices=self._empty, prefix_len=0, last_node=self._root)

    def lock(self, node: TreeNode) -> LockHandle:
        """A no-op receipt for the root returned by ``match_prefix``.

        Raises:
            ValueError: ``node`` is not this cache's root.
        """
        if node is not self._root:
            raise ValueError(f"cannot lock {node!r}: a NoPrefixCache holds no nodes")
        self._next_handle += 1
        self._live.add(self._next_handle)
        return LockHandle(node, (), self, self._next_handle)

    def unlock(self, handle: LockHandle) -> None:
        """Release a receipt. Raises ValueError when released twice or foreign."""
        if not isinstance(handle, LockHandle) or handle.owner is not self:
            raise ValueError(f"unlock of {handle!r}: not a lock handle of this cache")
        if handle.released:
            raise ValueError(f"unlock of {handle!r}: it was already released (unlock once)")
        handle.released = True
        self._live.discard(handle.handle_id)

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Slots for ``num_tokens`` (whole pages), or None when the pool is short."""
        slots = self._allocator.alloc(num_tokens)
        if slots is not None:
            self._num_held += len(slots)
        return slots

    def free(self, slots: torch.Tensor) -> None:
        """Return whole pages of held slots (ValueError on double free / partial pages)."""
        _check_slots("slots", slots, self.device)
        self._allocator.free(slots)
        self._num_held -= len(slots)

    def insert(self, params: InsertParams) -> InsertResult:
        """Free the caller's whole pages of ``value``; cache nothing.

        Raises:
            ValueError: as ``UnifiedCache.insert``, and for ``prev_prefix_len > 0``.
        """
        _, aligned_len = _check_insert(params, self.page_size, self.device)
        if params.prev_prefix_len:
            raise ValueError(
                f"prev_prefix_len={params.prev_prefix_len} but a NoPrefixCache never matches; "
                "pass 0"
            )
        if params.mamba_value is not None:
            raise ValueError("mamba_value given but this cache has no MAMBA component")
        if aligned_len:
            self._allocator.free(params.value[:aligned_len])
            self._num_held -= aligned_len
        self._counters["insert_calls"] += 1
        return InsertResult(prefix_len=0, last_node=self._root)

    def evict(self, num_tokens: int) -> int:
        """Nothing is cached: frees nothing, returns 0."""
        if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 0:
            raise ValueError(f"num_tokens must be a non-negative int, got {num_tokens!r}")
        return 0

    def pool(self, name: PoolName | str) -> KVPool | None:
        """The ``KVPool`` for ``KV`` (None without a layout or for other pools)."""
        try:
            name = PoolName(name)
        except ValueError:
            raise ValueError(f"unknown pool {name!r}") from None
        return self._kv_pool if name is PoolName.KV else None

    def stats(self) -> dict[str, Any]:
        free = self._allocator.available_size()
        return {
            "page_size": self.page_size,
            "total_tokens": self._allocator.total_size(),
            "free_tokens": free,
            "cached_tokens": 0,
            "held_tokens": self._num_held,
            "num_nodes": 0,
            "num_locks": len(self._live),
            "hit_tokens": 0,
            **self._counters,
        }

    def check_invariants(self) -> None:
        """Assert free + held == total."""
        total, free = self._allocator.total_size(), self._allocator.available_size()
        assert free + self._num_held == total, (
            f"NoPrefixCache: free {free} + held {self._num_held} != total {total}"
        )

    def attach_linker(self, linker: Any) -> None:
        """Always raises: a cache that stores nothing cannot link to a store."""
        raise ValueError("NoPrefixCache caches nothing; attach a linker to a UnifiedCache")

    def detach_linker(self, linker: Any) -> None:
        """Always raises: no linker can be attached."""
        raise ValueError(f"{linker!r} is not attached: a NoPrefixCache takes no linker")
