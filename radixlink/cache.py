"""``UnifiedCache``: the one object engines use (match / lock / alloc / insert / evict / free).

Owns assembly (allocator, pools, components, tree), the validation of caller input, the one
eviction path (evict, then apply the slot decisions) and the namespace a request lives in. The
tree walk and component rules live below it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from radixlink.checks import (
    check_count,
    check_insert,
    check_insert_slots,
    check_linkable,
    check_req_id,
    check_slots,
)
from radixlink.components.assembly import build_components, build_memory
from radixlink.components.base import TreeComponent, alloc_or_evict
from radixlink.config import CacheConfig
from radixlink.contract import (
    EvictParams,
    InsertParams,
    InsertResult,
    MatchResult,
    PoolName,
)
from radixlink.eviction import EvictionPath
from radixlink.hashing import layer_namespaces
from radixlink.hybrid_slots import HybridSlots
from radixlink.kvevents import KVEventQueue
from radixlink.memory.allocator import tensor_device
from radixlink.tokens import token_bytes
from radixlink.tree.invariants import check_tree
from radixlink.tree.keys import KeyPacker
from radixlink.tree.locks import LockHandle
from radixlink.tree.node import MatchPath, TreeNode
from radixlink.tree.tree import RadixTree

# What the cache and its tree call on an attached linker.
_LINKER_HOOKS = ("lookup", "on_insert", "before_evict")


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

    Hybrid caches (``sliding_window`` / ``mamba_num_states``) keep these methods; what a request
    holds beyond full pages goes through ``cache.hybrid`` (``HybridSlots``: ``swa_slots``,
    ``free_swa``, ``alloc_state``, ``copy_state``, ``free_state``; docs/tree.md, "Hybrid").

    Args:
        config: sizes, device, layouts and modes.
    """

    def __init__(self, config: CacheConfig):
        if not isinstance(config, CacheConfig):
            raise ValueError(f"UnifiedCache needs a CacheConfig, got {type(config).__name__}")
        self.config = config
        self.page_size = config.page_size
        self.device = tensor_device(config.device)
        memory = build_memory(config, self.device)
        parts = build_components(config, memory)
        self._pools = memory.pools
        self._full, self._swa, self._mamba = parts.full, parts.swa, parts.mamba
        self._components: tuple[TreeComponent, ...] = parts.ordered
        self.tree = RadixTree(self._components, config.page_size, namespace=config.namespace,
                              hashing=config.hashing_enabled, hash_algo=config.hash_algo)
        self._eviction = EvictionPath(self.tree, self._components)
        self.hybrid = HybridSlots(self.tree, parts.full, parts.swa, parts.mamba, self.device,
                                  self._eviction.make_room)
        self._linker: Any = None
        # NOTE: hashes a lookup computed and handed down to the tree, for the served insert
        self._hashes_for = self.tree.hash_memo.hashes_for
        self._empty = torch.empty(0, dtype=torch.int64, device=self.device)
        self._packer = KeyPacker()
        self._counters = {"match_calls": 0, "match_tokens": 0, "hit_tokens": 0,
                          "insert_calls": 0, "loaded_inserts": 0}
        self.kv_events: KVEventQueue | None = None

    @property
    def components(self) -> tuple[TreeComponent, ...]:
        """The tree's components, backbone (FULL) first."""
        return self._components

    @property
    def linker(self) -> Any:
        return self._linker

    # ---------------------------------------------------------------- requests

    def match_prefix(
        self, tokens: Any, req_id: Any = None, *, namespace: Any = None, touch: bool = True
    ) -> MatchResult:
        """The longest cached whole-page prefix of ``tokens`` that every component can serve.

        Read-only apart from recency (it never splits, evicts or allocates, on any
        component); the prefix may end inside ``last_node`` (``node_offset`` tokens of it).
        Lock ``last_node`` before the next ``alloc``/``evict`` if you will use
        ``device_indices`` (or ``swa_indices``). On a MAMBA cache ``mamba_slot`` is the tree's
        state at the boundary (read it, never write it); take your own copy with
        ``hybrid.copy_state(last_node)`` after locking.

        Args:
            tokens: token ids (list, numpy array or tensor of ints in ``[0, 2**32)``).
            req_id: the request's id; with a linker attached it also looks the uncached tail
                up in the store (``external_hit_len``).
            namespace: the request's ``Namespace`` (cache_salt, extra_key), layered on the
                cache's own (model, layout); None = the cache's own. Layering is idempotent,
                so an already layered namespace (a linker's lookup) may be passed again.
            touch: False = a peek that changes nothing at all: no recency, no counters, no
                store lookup (the linker's own queries, inspection).

        Raises:
            ValueError: malformed ``tokens``, an unhashable ``req_id``, or a namespace that
                names another model.
        """
        if req_id is not None:
            check_req_id(req_id)
        key = self._packer.pack(tokens)
        base = self.config.namespace
        own = base if namespace is None or namespace == base else \
            self._resolve_namespace(namespace)
        result = self._result(self.tree.match(key, self._tree_namespace(own), touch=touch))
        if not touch:
            return result
        counters = self._counters
        counters["match_calls"] += 1
        counters["match_tokens"] += len(key) >> 2
        counters["hit_tokens"] += result.prefix_len
        if req_id is not None and self._linker is not None:
            self._linker.lookup(result, key, req_id, own)
        return result

    def match_node(self, node: TreeNode) -> MatchResult:
        """The read-only match of the tokens from the root through ``node`` (the ``last_node``
        of an insert that just returned): what every component serves along that path, with
        no walk of the key; ``prefix_len`` is short of ``node``'s end when some component
        cannot serve it whole. A peek: no recency, counters or lookup."""
        return self._result(self.tree.match_node(node))

    def _result(self, path: MatchPath) -> MatchResult:
        """A ``MatchResult`` of the tree's accepted ``path``: each component fills its part."""
        result = MatchResult(device_indices=self._empty, prefix_len=path.prefix_len,
                             last_node=path.last_node, node_offset=path.node_offset)
        for component in self._components:
            component.fill_match(result, path)
        return result

    def _resolve_namespace(self, namespace: Any) -> Any:
        """The namespace a request with ``namespace`` lives in: the cache's own, with the
        request's cache_salt / extra_key layered on top (never replacing the model)."""
        return layer_namespaces(self.config.namespace, namespace)

    def _tree_namespace(self, namespace: Any) -> Any:
        return None if namespace is None or namespace == self.config.namespace else namespace

    def lock(self, node: TreeNode) -> LockHandle:
        """Protect ``node`` (and what a request there needs) from eviction; returns the receipt
        for ``unlock``. FULL protects the path to the root, SWA its last window, MAMBA the
        node's state. Locking a root (after an empty match) is a valid no-op.

        Raises:
            ValueError: ``node`` was evicted meanwhile or belongs to another cache.
        """
        return self.tree.locks.lock(node)  # NOTE: the tree's lock table, without a forward

    def unlock(self, handle: LockHandle) -> None:
        """Release a ``lock`` receipt.

        Raises:
            ValueError: ``handle`` was already released or comes from another cache.
        """
        self.tree.locks.unlock(handle)

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Slots for ``num_tokens`` rounded up to whole pages, evicting cached data when short;
        None when even eviction cannot make room (locked data stays). On an SWA cache every
        returned full page has a fresh SWA page mapped (``hybrid.swa_slots`` translates).

        Raises:
            ValueError: ``num_tokens`` is not a non-negative int.
        """
        full, swa, room = self._full, self._swa, self._eviction.make_room
        source = None if swa is None else swa.alloc_mapped

        def make_room() -> None:
            need = -(-num_tokens // self.page_size) * self.page_size
            room(full.index, need - full.allocator.available_size())
            if swa is not None:  # evicting full KV above may have freed SWA data already
                room(swa.index, need - swa.allocator.swa_available_size())

        return alloc_or_evict(make_room, full.alloc, num_tokens, source)

    def free(self, slots: torch.Tensor) -> None:
        """Return whole pages of slots that the caller holds (with their SWA pages).

        Raises:
            ValueError: slots the tree owns, double frees, partial pages; nothing changes.
        """
        check_slots("slots", slots, self.device)
        if self._swa is None:
            self._full.free(slots)
        else:
            self._swa.free_with_full(slots, self._full.free)

    def insert(self, params: InsertParams) -> InsertResult:
        """Cache ``params.key`` with the caller's slots ``params.value`` (whole pages only).

        Pages the tree already held beyond ``prev_prefix_len`` are duplicates and are freed
        here; pages it takes are the tree's from now on. The caller frees only its partial
        tail page (``value`` beyond the last whole page, plus its padding). SWA: the caller's
        SWA pages of ``[max(prev_prefix_len, swa_evicted_seqlen), len)`` (as far back as they
        are all mapped) are kept or heal tombstones, the rest are freed. MAMBA: the tree takes
        ``mamba_value`` (the state at ``len(value)``, which must be whole pages) or frees it.

        Raises:
            ValueError: malformed key or value; a value longer than the key; an unaligned or
                too long ``prev_prefix_len``; ``value[:prev_prefix_len]`` other than the tree's
                slots there; beyond it, slots that are not distinct page-aligned runs the
                caller holds (free, padding, out of range, repeated, tree-owned); a
                ``mamba_value`` that is not a held state slot; options this cache has no
                component for. Nothing changes then.
        """
        key, aligned_len = check_insert(params, self.page_size, self.device,
                                        self._packer.pack_extension)
        if self.config.check_inserts:
            check_insert_slots(params, aligned_len, self._full, self._mamba)
        namespace = self.config.namespace if params.namespace is None else \
            self._resolve_namespace(params.namespace)
        # NOTE: the page hashes a recent lookup of these tokens handed down to the tree
        known = None if self._linker is None else self._hashes_for(key, namespace)
        result = self._insert(key, aligned_len, params, namespace, hit=True, page_hashes=known)
        self._counters["insert_calls"] += 1
        if self._linker is not None:
            self._linker.on_insert(params, result)
        return result

    def insert_loaded(self, params: InsertParams, *,
                      page_hashes: tuple[int, list[str]] | None = None) -> InsertResult:
        """``insert`` of what this cache's linker loaded: the locked device prefix plus the
        slots its PREPARE reserved (whole pages, ``params.key`` as the lookup packed it,
        ``params.namespace`` already layered). Not a hit (no hit counts, no write-policy
        trigger, no linker callback), and the slots are not checked as a caller's are (the
        linker allocated them); the tree still checks that ``value[:prev_prefix_len]`` is
        exactly its own slots there. ``page_hashes`` = ``(first page, hashes)``: the lookup's
        chain hashes. ``match_node(result.last_node)`` then tells what the tree serves.

        Raises:
            ValueError: the prefix is not the tree's (see above); nothing changed.
        """
        key = token_bytes(params.key)
        result = self._insert(key, params.value.shape[0], params, params.namespace, hit=False,
                              page_hashes=page_hashes)
        self._counters["loaded_inserts"] += 1
        return result

    def _insert(self, key: bytes, aligned_len: int, params: InsertParams, namespace: Any, *,
                hit: bool, page_hashes: tuple[int, list[str]] | None) -> InsertResult:
        if params.namespace is not None:  # NOTE: the tree keys roots by the layered namespace
            params = dataclasses.replace(params, namespace=self._tree_namespace(namespace))
        # NOTE: a publish (the one non-hit insert) names exactly the locked prefix: the tree
        # compares value[:prev_prefix_len] with its slots there
        result, effects = self.tree.insert(key, params.value, params, aligned_len, hit=hit,
                                           page_hashes=page_hashes, strict_prefix=not hit)
        self._eviction.apply(effects)
        return result

    def evict(self, num_tokens: int | EvictParams) -> Any:
        """Free cached data of unlocked nodes, least recently used first.

        Args:
            num_tokens: full-pool tokens to free (returns the tokens freed, an int), or an
                ``EvictParams`` with per-pool targets (returns an ``EvictResult``).

        Raises:
            ValueError: a negative or non-int target, or a target for a pool this cache lacks.
        """
        if isinstance(num_tokens, EvictParams):
            return self._eviction.evict_params(num_tokens)
        if check_count("num_tokens", num_tokens) == 0:
            return 0
        return self._eviction.evict(self._eviction.targets(full=num_tokens)).num_freed[0]

    # ---------------------------------------------------------------- inspection

    def pool(self, name: PoolName | str) -> Any:
        """The device pool behind ``name``: the ``KVPool`` for ``KV`` and ``SWA``, the
        ``MambaStatePool`` for ``MAMBA``; None when this cache manages indices only there or
        has no such pool."""
        try:
            name = PoolName(name)
        except ValueError:
            names = [p.value for p in PoolName]
            raise ValueError(f"unknown pool {name!r}; expected one of {names}") from None
        return self._pools.get(name)

    def stats(self) -> dict[str, Any]:
        """Counters and sizes (tokens): free / cached / held / evictable / protected, nodes,
        matches and hits, and what eviction freed per pool (cascades included: a MAMBA or SWA
        eviction that removes a leaf counts its full tokens in ``evicted_tokens``)."""
        out: dict[str, Any] = {
            "page_size": self.page_size,
            "total_tokens": self._full.allocator.total_size(),
            "num_nodes": self.tree.num_nodes,
            "num_roots": len(self.tree.roots()),
            "num_locks": len(self.tree.live_handles()),
        }
        for component in self._components:
            out.update(component.stats())
        evicted = self._eviction.num_evicted
        out["evicted_tokens"] = evicted[0]
        if self._swa is not None:
            out["swa_evicted_tokens"] = evicted[self._swa.index]
        if self._mamba is not None:
            out["mamba_evicted_states"] = evicted[self._mamba.index]
        out.update(self._counters)
        return out

    def enable_kv_events(self, queue: KVEventQueue | None = None) -> KVEventQueue:
        """Emit device (and the linker's store) ``KVEvent``s into ``queue`` (new by default)."""
        self.kv_events = self.tree.kv_events = KVEventQueue() if queue is None else queue
        return self.kv_events

    def check_invariants(self) -> None:
        """Assert the tree's structural rules and, per pool, free + cached + held == total."""
        check_tree(self.tree)
        for component in self._components:
            component.check_accounting()

    def attach_linker(self, linker: Any) -> None:
        """Attach an ``ExternalCacheLinker``. From then on ``match_prefix`` with a ``req_id``
        calls ``linker.lookup(result, key, req_id, namespace)``, ``insert`` calls
        ``linker.on_insert(params, result)``, and the tree tells the linker (its
        ``TreeObserver``), before eviction frees any of a node's data, the node while that data
        is intact. A split tells nobody: store marks are kept by page hash. A lookup hands the
        page hashes it computed down to the tree (``tree.hash_memo``), and the insert of the
        same tokens takes them from there.

        Raises:
            ValueError: the cache was built without ``enable_external_cache_linker`` (no page
                hashes) or without a layout for some pool (nothing to move), ``linker`` lacks
                a hook, or another linker is attached.
        """
        check_linkable(self.config, self._components, self._pools)
        missing = [name for name in _LINKER_HOOKS if not callable(getattr(linker, name, None))]
        if missing:
            raise ValueError(
                f"attach_linker takes an ExternalCacheLinker (or an object with its hooks "
                f"{', '.join(_LINKER_HOOKS)}); {type(linker).__name__} lacks {', '.join(missing)}"
            )
        if self._linker is not None and self._linker is not linker:
            raise ValueError("a linker is already attached to this cache; close it first")
        self._linker = linker
        self.tree.observer = linker

    def detach_linker(self, linker: Any) -> None:
        """Undo ``attach_linker`` (the linker's ``close`` calls it).

        Raises:
            ValueError: ``linker`` is not the attached one.
        """
        if self._linker is not linker:
            raise ValueError(f"{linker!r} is not the linker attached to this cache")
        self._linker = None
        self.tree.observer = None

