"""``NoPrefixCache``: the ``UnifiedCache`` contract with prefix caching off (the cache-off run).

Owns an allocator and nothing else: match always misses, insert frees the caller's pages.
"""

from __future__ import annotations

from typing import Any

import torch

from radixlink.checks import check_insert, check_slots
from radixlink.components.assembly import build_memory
from radixlink.config import CacheConfig
from radixlink.contract import InsertParams, InsertResult, MatchResult, PoolName
from radixlink.tokens import token_bytes
from radixlink.tree.locks import LockHandle
from radixlink.tree.node import TreeNode


class NoPrefixCache:
    """Same methods as ``UnifiedCache``; nothing is ever cached.

    ``match_prefix`` returns an empty prefix ending at a root node, ``lock`` of that root is a
    no-op receipt (unlocking twice still raises), ``insert`` frees ``value`` beyond
    ``prev_prefix_len`` (which must be 0: there is nothing to have matched) and its
    ``mamba_value``, and ``evict`` frees nothing. Hybrid configs get the same SWA and state
    calls as ``UnifiedCache.hybrid`` on ``hybrid`` (``swa_slots``, ``free_swa``,
    ``alloc_state``, ``copy_state``, ``free_state``).

    Args:
        config: as for ``UnifiedCache``; hashing and eviction options are ignored.
    """

    def __init__(self, config: CacheConfig):
        if not isinstance(config, CacheConfig):
            raise ValueError(f"NoPrefixCache needs a CacheConfig, got {type(config).__name__}")
        self.config = config
        self.page_size = config.page_size
        self.device = torch.device(config.device)
        memory = build_memory(config, self.device)
        self._allocator = memory.full
        self._hybrid, self._states, self._pools = memory.hybrid, memory.states, memory.pools
        self.hybrid = NoCacheHybrid(memory.hybrid, memory.states, self.page_size, self.device)
        self._root = TreeNode(0, b"", None, 1)
        self._empty = torch.empty(0, dtype=torch.int64, device=self.device)
        self._num_held = 0
        self._next_handle = 0
        self._live: set[int] = set()
        self._counters = {"match_calls": 0, "match_tokens": 0, "insert_calls": 0}

    def match_prefix(
        self, tokens: Any, req_id: Any = None, *, namespace: Any = None, touch: bool = True
    ) -> MatchResult:
        """Always an empty match (``tokens`` is still validated; ``touch=False`` counts
        nothing)."""
        num = len(token_bytes(tokens)) >> 2
        if touch:
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
        """Slots for ``num_tokens`` (whole pages, each with an SWA page when the config has a
        window), or None when a pool is short."""
        hybrid = self._hybrid
        slots = self._allocator.alloc(num_tokens) if hybrid is None else hybrid.alloc(num_tokens)
        if slots is not None:
            self._num_held += len(slots)
            self.hybrid.num_swa_held += 0 if hybrid is None else len(slots)
        return slots

    def free(self, slots: torch.Tensor) -> None:
        """Return whole pages of held slots (ValueError on double free / partial pages)."""
        check_slots("slots", slots, self.device)
        if self._hybrid is None:
            self._allocator.free(slots)
        else:
            mapped = self.hybrid.swa_mapped(slots)
            self._hybrid.free(slots)
            self.hybrid.num_swa_held -= mapped
        self._num_held -= len(slots)

    def insert(self, params: InsertParams) -> InsertResult:
        """Free the caller's whole pages of ``value``; cache nothing.

        Raises:
            ValueError: as ``UnifiedCache.insert``, and for ``prev_prefix_len > 0``.
        """
        _, aligned_len = check_insert(params, self.page_size, self.device)
        if params.prev_prefix_len:
            raise ValueError(
                f"prev_prefix_len={params.prev_prefix_len} but a NoPrefixCache never matches; "
                "pass 0"
            )
        state = params.mamba_value
        if state is not None and self._states is None:
            raise ValueError("mamba_value given but this cache has no MAMBA component")
        if state is not None and not self._states.is_allocated(state):  # type: ignore[union-attr]
            raise ValueError(f"InsertParams.mamba_value: state slot {state!r} is not allocated")
        if aligned_len:
            self.free(params.value[:aligned_len])
        if state is not None:
            self.hybrid.free_state(state)
        self._counters["insert_calls"] += 1
        return InsertResult(prefix_len=0, last_node=self._root)

    def evict(self, num_tokens: int) -> int:
        """Nothing is cached: frees nothing, returns 0."""
        if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 0:
            raise ValueError(f"num_tokens must be a non-negative int, got {num_tokens!r}")
        return 0

    def pool(self, name: PoolName | str) -> Any:
        """The pool behind ``name`` as in ``UnifiedCache.pool`` (None without a layout)."""
        try:
            name = PoolName(name)
        except ValueError:
            raise ValueError(f"unknown pool {name!r}") from None
        return self._pools.get(name)

    def stats(self) -> dict[str, Any]:
        free = self._allocator.available_size()
        out: dict[str, Any] = {
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
        if self._hybrid is not None:
            out["swa_free_tokens"] = self._hybrid.swa_available_size()
            out["swa_held_tokens"] = self.hybrid.num_swa_held
        if self._states is not None:
            out["mamba_free_states"] = self._states.available_size()
            out["mamba_held_states"] = self.hybrid.num_states_held
        return out

    def check_invariants(self) -> None:
        """Assert free + held == total, per pool."""
        pools: list[tuple[Any, int, str]] = [(self._allocator, self._num_held, "kv")]
        if self._hybrid is not None:
            pools.append((self._hybrid.swa, self.hybrid.num_swa_held, "swa"))
        if self._states is not None:
            pools.append((self._states, self.hybrid.num_states_held, "mamba"))
        for alloc, held, name in pools:
            total, free = alloc.total_size(), alloc.available_size()
            assert free + held == total, (
                f"NoPrefixCache {name}: free {free} + held {held} != total {total}"
            )

    def attach_linker(self, linker: Any) -> None:
        """Always raises: a cache that stores nothing cannot link to a store."""
        raise ValueError("NoPrefixCache caches nothing; attach a linker to a UnifiedCache")

    def detach_linker(self, linker: Any) -> None:
        """Always raises: no linker can be attached."""
        raise ValueError(f"{linker!r} is not attached: a NoPrefixCache takes no linker")


class NoCacheHybrid:
    """``UnifiedCache.hybrid``'s calls on a cache that caches nothing: request-held SWA pages
    and state slots, counted so ``check_invariants`` can balance every pool.

    Args:
        hybrid: the SWA allocator (None without a window).
        states: the state slots (None without MAMBA).
        page_size: tokens per page.
        device: where slot tensors live.
    """

    def __init__(self, hybrid: Any, states: Any, page_size: int, device: torch.device):
        self._hybrid, self._states = hybrid, states
        self.page_size, self.device = page_size, device
        self.num_swa_held = 0
        self.num_states_held = 0

    def swa_slots(self, full_slots: torch.Tensor) -> torch.Tensor:
        """The SWA slot mapped to each full slot (0 where none is)."""
        return self._swa("swa_slots").translate_full_to_swa(full_slots)

    def free_swa(self, full_slots: torch.Tensor) -> None:
        """Free the SWA pages mapped to held ``full_slots`` (whole pages)."""
        hybrid = self._swa("free_swa")
        check_slots("full_slots", full_slots, self.device)
        mapped = self.swa_mapped(full_slots)
        hybrid.free_swa(full_slots)
        self.num_swa_held -= mapped

    def alloc_state(self) -> int | None:
        """A fresh state slot, or None when all are held."""
        slot = self._states_of("alloc_state").alloc()
        self.num_states_held += slot is not None
        return slot

    def copy_state(self, node: TreeNode) -> int | None:
        """Never possible: nothing is cached, so no match ends at a state.

        Raises:
            ValueError: always (after checking the cache has a MAMBA pool).
        """
        self._states_of("copy_state")
        raise ValueError(f"copy_state of {node!r}: a NoPrefixCache caches no state (its "
                         "matches are always empty); use alloc_state")

    def free_state(self, slot: int) -> None:
        """Return a state slot (ValueError on a double free)."""
        self._states_of("free_state").free(slot)
        self.num_states_held -= 1

    def swa_mapped(self, full_slots: torch.Tensor) -> int:
        """SWA tokens mapped to the whole full pages ``full_slots``."""
        assert self._hybrid is not None
        ps = self.page_size
        return self._hybrid.count_mapped(full_slots[::ps]) * ps

    def _swa(self, what: str) -> Any:
        if self._hybrid is None:
            raise ValueError(f"{what}: this cache has no SWA component (set sliding_window)")
        return self._hybrid

    def _states_of(self, what: str) -> Any:
        if self._states is None:
            raise ValueError(f"{what}: this cache has no MAMBA component (set mamba_num_states)")
        return self._states
