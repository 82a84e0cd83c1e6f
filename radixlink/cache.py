"""``UnifiedCache``: the one object engines use (match / lock / alloc / insert / evict / free).

Owns assembly (allocator, pools, components, tree) and the validation of caller input; applies
the slot decisions the tree returns. The tree walk and component rules live below it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from radixlink.components.base import TreeComponent
from radixlink.components.full import FullComponent
from radixlink.config import CacheConfig
from radixlink.contract import InsertParams, InsertResult, MatchResult, PoolName
from radixlink.memory.allocator import PagedAllocator
from radixlink.memory.pools import KVPool
from radixlink.tree.invariants import check_tree
from radixlink.tree.keys import KeyPacker, token_bytes
from radixlink.tree.node import LockHandle, TreeNode
from radixlink.tree.tree import RadixTree


class UnifiedCache:
    """Radix prefix cache over paged device memory.

    The per-request protocol (one request; ``tokens`` may be a list, numpy array or tensor)::

        m = cache.match_prefix(prompt)              # m.prefix_len tokens cached, page aligned
        h = cache.lock(m.last_node)                 # protect them from eviction
        new = cache.alloc(len(seq) - m.prefix_len)  # whole pages; evicts when short
        kv = torch.cat([m.device_indices, new])     # ... run the model, write KV at kv ...
        n = len(seq) // page_size * page_size
        cache.insert(InsertParams(key=seq, value=kv[:n], prev_prefix_len=m.prefix_len))
        cache.free(kv[n:])                          # the partial tail page is the caller's
        cache.unlock(h)

    Slot ownership: slots from ``alloc`` are the caller's until ``insert`` takes them (the
    tree adopts new pages and frees duplicates itself) or ``free`` returns them. Slots in a
    ``MatchResult`` are the tree's: read them, never free them.

    Args:
        config: sizes, device, layout and modes.
    """

    def __init__(self, config: CacheConfig):
        if not isinstance(config, CacheConfig):
            raise ValueError(f"UnifiedCache needs a CacheConfig, got {type(config).__name__}")
        self.config = config
        self.page_size = config.page_size
        self.device = torch.device(config.device)
        self._allocator = PagedAllocator(config.num_tokens, config.page_size, self.device)
        self._kv_pool = (
            None
            if config.kv_layout is None
            else KVPool(config.kv_layout, self._allocator.num_slots, self.device)
        )
        self._full = FullComponent(self._allocator, config.eviction_policy)
        self._components: tuple[TreeComponent, ...] = (self._full,)
        self.tree = RadixTree(
            self._components,
            config.page_size,
            hashing=config.hashing_enabled,
            hash_algo=config.hash_algo,
            namespace=config.namespace,
        )
        self._linker: Any = None
        self._empty = torch.empty(0, dtype=torch.int64, device=self.device)
        self._packer = KeyPacker()
        self._counters = {"match_calls": 0, "match_tokens": 0, "hit_tokens": 0, "insert_calls": 0}

    @property
    def components(self) -> tuple[TreeComponent, ...]:
        """The tree's components, backbone (FULL) first."""
        return self._components

    @property
    def linker(self) -> Any:
        return self._linker

    # ---------------------------------------------------------------- requests

    def match_prefix(
        self, tokens: Any, req_id: Any = None, *, namespace: Any = None
    ) -> MatchResult:
        """The longest cached whole-page prefix of ``tokens``.

        Read-only apart from recency; the prefix may end inside ``last_node``
        (``node_offset`` tokens of it). Lock ``last_node`` before the next ``alloc``/``evict``
        if you will use ``device_indices``.

        Args:
            tokens: token ids (list, numpy array or tensor of ints in ``[0, 2**32)``).
            req_id: the request's id; with a linker attached it also looks the uncached tail
                up in the store (``external_hit_len``).
            namespace: the request's namespace (``Namespace``); None = the cache's own.

        Raises:
            ValueError: malformed ``tokens``.
        """
        key = self._packer.pack(tokens)
        path = self.tree.match(key, namespace)
        result = MatchResult(
            device_indices=self._empty,
            prefix_len=path.prefix_len,
            last_node=path.last_node,
            node_offset=path.node_offset,
        )
        for component in self._components:
            component.fill_match(result, path)
        counters = self._counters
        counters["match_calls"] += 1
        counters["match_tokens"] += len(key) >> 2
        counters["hit_tokens"] += path.prefix_len
        if req_id is not None and self._linker is not None:
            self._linker.lookup(result, key, req_id, namespace)
        return result

    def lock(self, node: TreeNode) -> LockHandle:
        """Protect ``node`` (and what a request there needs) from eviction; returns the receipt
        for ``unlock``. Locking a root (after an empty match) is a valid no-op.

        Raises:
            ValueError: ``node`` was evicted meanwhile or belongs to another cache.
        """
        return self.tree.lock(node)

    def unlock(self, handle: LockHandle) -> None:
        """Release a ``lock`` receipt.

        Raises:
            ValueError: ``handle`` was already released or comes from another cache.
        """
        self.tree.unlock(handle)

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Slots for ``num_tokens`` rounded up to whole pages, evicting cached data when short;
        None when even eviction cannot make room (locked data stays).

        Raises:
            ValueError: ``num_tokens`` is not a non-negative int.
        """
        slots = self._full.alloc(num_tokens)
        if slots is None:
            need = -(-num_tokens // self.page_size) * self.page_size
            self.evict(need - self._allocator.available_size())
            slots = self._full.alloc(num_tokens)
        return slots

    def free(self, slots: torch.Tensor) -> None:
        """Return whole pages of slots that the caller holds.

        Raises:
            ValueError: slots the tree owns, double frees, partial pages; nothing changes.
        """
        _check_slots("slots", slots, self.device)
        self._full.free(slots)

    def insert(self, params: InsertParams) -> InsertResult:
        """Cache ``params.key`` with the caller's slots ``params.value`` (whole pages only).

        Pages the tree already held beyond ``prev_prefix_len`` are duplicates and are freed
        here; pages it takes are the tree's from now on. The caller frees only its partial
        tail page (``value`` beyond the last whole page, plus its padding).

        Raises:
            ValueError: malformed key or value, a value longer than the key, an unaligned or
                too long ``prev_prefix_len``, value slots the tree already owns, or options this
                cache has no component for; nothing changes.
        """
        key, aligned_len = _check_insert(
            params, self.page_size, self.device, self._packer.pack_extension
        )
        if params.mamba_value is not None:
            raise ValueError("mamba_value given but this cache has no MAMBA component")
        value = params.value
        if self._full.ownership.any_owned(
            value, params.prev_prefix_len, aligned_len, whole_pages=True
        ):
            raise ValueError(
                "insert value holds slots the tree already owns beyond prev_prefix_len="
                f"{params.prev_prefix_len}; pass the match's prefix_len as prev_prefix_len"
            )
        result, effects = self.tree.insert(key, value, params, aligned_len)
        for component in self._components:
            component.apply(effects)
        self._counters["insert_calls"] += 1
        if self._linker is not None:
            self._linker.on_insert(params, result)
        return result

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` cached full-pool tokens if that many are evictable
        (unlocked), least recently used leaves first. Returns the tokens freed.

        Raises:
            ValueError: ``num_tokens`` is not a non-negative int.
        """
        if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 0:
            raise ValueError(f"num_tokens must be a non-negative int, got {num_tokens!r}")
        if num_tokens == 0:
            return 0
        effects = self.tree.evict([num_tokens])
        for component in self._components:
            component.apply(effects)
        return effects.num_freed[0]

    # ---------------------------------------------------------------- inspection

    def pool(self, name: PoolName | str) -> KVPool | None:
        """The device pool behind ``name`` (the ``KVPool`` for ``KV``), or None when this
        cache manages indices only or has no such pool."""
        try:
            name = PoolName(name)
        except ValueError:
            names = [p.value for p in PoolName]
            raise ValueError(f"unknown pool {name!r}; expected one of {names}") from None
        return self._kv_pool if name is PoolName.KV else None

    def stats(self) -> dict[str, Any]:
        """Counters and sizes (tokens): free / cached / held / evictable / protected, nodes,
        matches and hits, evicted."""
        out: dict[str, Any] = {
            "page_size": self.page_size,
            "total_tokens": self._allocator.total_size(),
            "num_nodes": self.tree.num_nodes,
            "num_locks": len(self.tree.live_handles()),
        }
        for component in self._components:
            out.update(component.stats())
        out.update(self._counters)
        return out

    def check_invariants(self) -> None:
        """Assert the tree's structural rules and, per pool, free + cached + held == total."""
        check_tree(self.tree)
        for component in self._components:
            component.check_accounting()

    def attach_linker(self, linker: Any) -> None:
        """Attach an ``ExternalCacheLinker``. From then on ``match_prefix`` with a ``req_id``
        calls ``linker.lookup(result, key, req_id, namespace)``, ``insert`` calls
        ``linker.on_insert(params, result)``, and eviction calls ``linker.before_evict(node)``
        while the node's full data is still intact.

        Raises:
            ValueError: the cache was built without ``enable_external_cache_linker`` (no page
                hashes), or another linker is attached.
        """
        if not self.config.enable_external_cache_linker:
            raise ValueError(
                "attach_linker needs page hashes: build the cache with "
                "CacheConfig(..., enable_external_cache_linker=True)"
            )
        if self._linker is not None and self._linker is not linker:
            raise ValueError("a linker is already attached to this cache; close it first")
        self._linker = linker
        self.tree.before_evict = getattr(linker, "before_evict", None)

    def detach_linker(self, linker: Any) -> None:
        """Undo ``attach_linker`` (the linker's ``close`` calls it).

        Raises:
            ValueError: ``linker`` is not the attached one.
        """
        if self._linker is not linker:
            raise ValueError(f"{linker!r} is not the linker attached to this cache")
        self._linker = None
        self.tree.before_evict = None


def _check_slots(name: str, slots: Any, device: torch.device) -> None:
    if not isinstance(slots, torch.Tensor):
        raise ValueError(f"{name} must be an int64 torch.Tensor, got {type(slots).__name__}")
    if slots.dtype != torch.int64 or slots.dim() != 1:
        shape = tuple(slots.shape)
        raise ValueError(f"{name} must be a 1-D int64 tensor, got {slots.dtype} {shape}")
    if slots.device != device:
        raise ValueError(f"{name} is on {slots.device}, the cache is on {device}")


def _check_insert(
    params: Any,
    page_size: int,
    device: torch.device,
    pack: Callable[[Any], bytes] = token_bytes,
) -> tuple[bytes, int]:
    """Validate an ``InsertParams``; return the packed key and the whole-page length."""
    if not isinstance(params, InsertParams):
        raise ValueError(f"insert takes an InsertParams, got {type(params).__name__}")
    key = pack(params.key)
    _check_slots("InsertParams.value", params.value, device)
    num_key, num_value = len(key) >> 2, params.value.shape[0]
    if num_value > num_key:
        raise ValueError(
            f"insert value has {num_value} slots but the key only {num_key} tokens; pass "
            "value[:len(key)]"
        )
    prev = params.prev_prefix_len
    if not isinstance(prev, int) or isinstance(prev, bool) or not 0 <= prev <= num_value:
        raise ValueError(
            f"prev_prefix_len must be an int in [0, {num_value}] (len(value)), got {prev!r}"
        )
    if prev % page_size:
        raise ValueError(
            f"prev_prefix_len={prev} is not a multiple of page_size={page_size}; pass the "
            "prefix_len of a match (always page aligned)"
        )
    seqlen = params.swa_evicted_seqlen
    if not isinstance(seqlen, int) or isinstance(seqlen, bool) or seqlen < 0:
        raise ValueError(f"swa_evicted_seqlen must be a non-negative int, got {seqlen!r}")
    return key, num_value - num_value % page_size
