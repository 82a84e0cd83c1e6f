"""``FullComponent``: full-attention KV slots on the tree, the backbone of every cache, and its
``PageOwnership`` (which pages the tree owns: the bitmap the facade consults before freeing).

Owns the full pool's side of the tree: node slot values, path locks, the leaf LRU/LFU set, the
tree-owned page bitmap and the held-by-requests count. Does not walk or reshape the tree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from radixlink.components.base import (
    ComponentLoad,
    SlotAllocator,
    TreeComponent,
    alloc_or_evict,
)
from radixlink.config import EvictionPolicy
from radixlink.contract import (
    ComponentType,
    MatchResult,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from radixlink.memory.allocator import outside
from radixlink.tree.lru import EvictableSet
from radixlink.tree.node import Effects, InsertContext, MatchPath, TreeNode

_FULL = ComponentType.FULL


class PageOwnership:
    """A bit per page: set while the tree owns the page.

    Args:
        num_pages: pages of the pool (page ids ``1..num_pages``; 0 is the padding page).
        page_size: slots per page.
        device: where slot tensors live.

    Slot tensors passed in must be whole-page runs (as allocators hand out).
    """

    def __init__(self, num_pages: int, page_size: int, device: torch.device):
        self.page_size = page_size
        self.device = device
        self._owned = torch.zeros(num_pages + 1, dtype=torch.bool, device=device)
        # NOTE: on CPU a numpy view of the same memory makes each mark/check ~1 us instead of
        # ~5-10 us of torch dispatch; this is on every insert, evict and free.
        self._np = self._owned.numpy() if device.type == "cpu" else None
        self._num_ids = np.array(num_pages + 1, dtype=np.uint64)  # page ids are 0..num_pages

    def mark(self, slots: torch.Tensor) -> None:
        """The tree took these pages."""
        if self._np is not None:
            self._np[self._np_pages(slots)] = True
        else:
            self._owned[self._pages(slots)] = True

    def unmark(self, slots: torch.Tensor) -> None:
        """The tree let these pages go."""
        if self._np is not None:
            self._np[self._np_pages(slots)] = False
        else:
            self._owned[self._pages(slots)] = False

    def any_owned(
        self,
        slots: torch.Tensor | np.ndarray,
        start: int = 0,
        end: int | None = None,
        *,
        whole_pages: bool = False,
    ) -> bool:
        """Whether any slot of ``slots[start:end]`` lies in a tree-owned page.

        With ``whole_pages`` the caller promises page-aligned runs from ``start``, and only
        each run's first slot is looked at (``page_size`` times less work). ``slots`` may be
        the host numpy view of CPU slots (a caller that has it already).
        """
        step = self.page_size if whole_pages else 1
        if self._np is not None:
            arr = (slots if isinstance(slots, np.ndarray) else slots.numpy())[start:end:step]
            # NOTE: count_nonzero, not .any(): ~1 us where a ufunc reduction costs ~3 us here
            return np.count_nonzero(self._np[arr // self.page_size]) > 0
        assert isinstance(slots, torch.Tensor), "device slots come as a tensor"
        part = slots[start:end:step]
        return part.numel() > 0 and bool(self._owned[part // self.page_size].any())

    def pages_owned(self, pages: np.ndarray) -> np.ndarray:
        """Per page id of ``pages`` (host int64, each in ``0..num_pages``): whether the tree
        owns it, as a host bool array (input checks: no torch dispatch on CPU). Ids outside
        the pool (caller input) are not owned."""
        if pages.size and outside(pages, self._num_ids):
            inside = (pages >= 0) & (pages < self._owned.shape[0])
            owned = np.zeros(pages.shape, dtype=np.bool_)
            owned[inside] = self.pages_owned(pages[inside])
            return owned
        if self._np is not None:
            return self._np[pages]
        return self._owned[torch.from_numpy(pages).to(self.device)].cpu().numpy()

    def owned_pages(self) -> torch.Tensor:
        """Ids of every tree-owned page, ascending (for invariant checks)."""
        return torch.nonzero(self._owned).reshape(-1)

    def count(self) -> int:
        """Tree-owned pages."""
        if self._np is not None:
            return int(np.count_nonzero(self._np))
        return int(self._owned.sum().item())

    def _np_pages(self, slots: torch.Tensor) -> np.ndarray:
        arr = slots.numpy()
        return arr[:: self.page_size] // self.page_size if self.page_size > 1 else arr

    def _pages(self, slots: torch.Tensor) -> torch.Tensor:
        return slots[:: self.page_size] // self.page_size if self.page_size > 1 else slots


class FullComponent(TreeComponent):
    """Full-attention KV: a node is matchable when its full slots are on device.

    Values are int64 slot tensors (one slot per token, whole pages). A lock protects the whole
    path to the root. Eviction removes unlocked leaves, least recently (or frequently) used
    first; a parent left as a leaf becomes a candidate in turn.

    Args:
        allocator: the full pool's allocator (slots come from it and go back to it).
        policy: LRU or LFU ordering of evictable leaves.
    """

    component_type = _FULL
    pool_name = PoolName.KV
    layout_setting = "kv_layout"
    takes_part_in_loads = True
    hit_policy = PoolHitPolicy.ALL_PAGES

    def __init__(
        self, allocator: SlotAllocator, policy: EvictionPolicy | str = EvictionPolicy.LRU
    ) -> None:
        super().__init__()
        self.allocator = allocator
        self.page_size = allocator.page_size
        self.ownership = PageOwnership(allocator.num_pages, allocator.page_size, allocator.device)
        self.policy = EvictionPolicy(policy)
        self.evictable = EvictableSet(0, self.policy)
        self.cached_tokens = 0
        self.protected_tokens = 0
        self.num_held = 0
        self._empty = torch.empty(0, dtype=torch.int64, device=allocator.device)
        self._num_slots = np.array((allocator.num_pages + 1) * allocator.page_size, np.uint64)

    def bind(self, tree: Any, index: int) -> None:
        super().bind(tree, index)
        assert index == 0, f"FullComponent must be the backbone (index 0), got {index}"

    # ---------------------------------------------------------------- structure

    def split(self, parent: TreeNode, child: TreeNode) -> None:
        value = child.values[0]
        if value is not None:
            cut = parent.num_tokens
            # NOTE: clones keep each node's tensor exactly its own size, so evicting one part
            # never pins the other's memory.
            parent.values[0] = value[:cut].clone()
            child.values[0] = value[cut:].clone()
        parent.lock_refs[0] = child.lock_refs[0]

    def refresh(self, node: TreeNode) -> None:
        if (
            not node.children
            and node.lock_refs[0] == 0
            and node.values[0] is not None
            and node.parent is not None
        ):
            self.evictable.add(node)
        else:
            self.evictable.discard(node)

    def keeps_leaf(self, node: TreeNode) -> bool:
        return node.values[0] is not None

    def release(self, node: TreeNode, effects: Effects) -> None:
        self.evictable.discard(node)
        value = node.values[0]
        if value is not None:
            node.values[0] = None
            num = value.shape[0]
            effects.freed[0].append(value)
            effects.num_freed[0] += num
            self.cached_tokens -= num

    # ---------------------------------------------------------------- requests

    def match_accept(self, nodes: list[TreeNode], limit: int) -> int:
        for node in nodes:
            if node.values[0] is None:
                return min(limit, node.seq_len - (len(node.key) >> 2))
        return limit

    def check_prefix(self, nodes: list[TreeNode], value: torch.Tensor, prev: int) -> str | None:
        """``value[:prev]`` must be exactly the tree's slots there (what a locked match gave).
        Checked once per load publish, not per request."""
        pos = 0
        for node in nodes:
            if pos >= prev:
                break
            own = node.values[0]
            assert own is not None, f"{node}: a tombstone inside the held prefix"
            take = min(own.shape[0], prev - pos)
            if not torch.equal(own[:take], value[pos : pos + take]):
                return (
                    f"insert value[:{prev}] (prev_prefix_len) differs from the tree's slots "
                    f"for those tokens (first differing run at tokens [{pos}, {pos + take})); "
                    "pass the device_indices of a match whose last_node you kept locked"
                )
            pos += take
        return None

    def insert_unevict(self, ctx: InsertContext, node: TreeNode, start: int, end: int) -> None:
        assert start >= ctx.prev_prefix_len, f"unevict of {node} below prev_prefix_len"
        self.insert_leaf(ctx, node, start, end)
        self.refresh(node)

    def insert_leaf(self, ctx: InsertContext, node: TreeNode, start: int, end: int) -> None:
        # NOTE: a copy, because callers often pass views of a reusable request table; on the
        # host through numpy (about 1 us against 5 for a torch slice and clone here)
        value = ctx.value
        if value.device.type == "cpu":
            slots = torch.from_numpy(value.numpy()[start:end].copy())
        else:
            slots = value[start:end].clone()
        node.values[0] = slots
        self.cached_tokens += end - start
        ctx.adopt(0, _FULL, start, end, slots)

    def lock(self, node: TreeNode) -> None:
        if node.lock_refs[0] == 0 and node.evict_entries[0] is not None:
            self.evictable.discard(node)
        while node.parent is not None:
            if node.lock_refs[0] == 0:
                self.protected_tokens += len(node.key) >> 2
            node.lock_refs[0] += 1
            node = node.parent

    def unlock(self, node: TreeNode, receipt: Any) -> None:
        first = node
        while node.parent is not None:
            assert node.lock_refs[0] > 0, f"unlock below zero at {node}"
            node.lock_refs[0] -= 1
            if node.lock_refs[0] == 0:
                self.protected_tokens -= len(node.key) >> 2
            node = node.parent
        if first.lock_refs[0] == 0 and not first.children and first.values[0] is not None:
            self.evictable.add(first)

    def evict(self, target: int, effects: Effects) -> None:
        pop, remove = self.evictable.pop, self.tree.remove_leaf
        while effects.num_freed[0] < target:
            node = pop()
            if node is None:
                break
            remove(node, effects)

    # ---------------------------------------------------------------- checks

    def check_node(self, node: TreeNode) -> int:
        value, refs = node.values[0], node.lock_refs[0]
        assert refs >= 0, f"negative full lock count on {node}"
        should = not node.children and refs == 0 and value is not None
        assert (node in self.evictable) == should, (
            f"{node}: in evictable set = {node in self.evictable}, expected {should}"
        )
        if value is None:
            assert node.children, f"{node}: a leaf whose full value is a tombstone"
            return 0
        assert isinstance(value, torch.Tensor) and value.dtype == torch.int64, (
            f"{node}: full value must be an int64 tensor"
        )
        assert len(value) == node.num_tokens, (
            f"{node}: {len(value)} slots for {node.num_tokens} tokens"
        )
        return len(value)

    def check(self, cached: int, handles: list[Any]) -> None:
        assert cached == self.cached_tokens, (
            f"full: tree holds {cached} tokens, counter says {self.cached_tokens}"
        )
        self.evictable.check()
        expected: dict[int, int] = {}
        nodes: dict[int, TreeNode] = {}
        for handle in handles:
            node = handle.node
            while node.parent is not None:
                expected[id(node)] = expected.get(id(node), 0) + 1
                nodes[id(node)] = node
                node = node.parent
        protected = 0
        for node in self.tree.iter_nodes():
            refs = node.lock_refs[0]
            assert refs == expected.get(id(node), 0), (
                f"{node}: full lock count {refs}, live handles say {expected.get(id(node), 0)}"
            )
            protected += node.num_tokens if refs else 0
        assert protected == self.protected_tokens, (
            f"full: protected tokens {self.protected_tokens}, tree says {protected}"
        )

    # ---------------------------------------------------------------- facade

    def fill_match(self, result: MatchResult, path: MatchPath) -> None:
        nodes = path.nodes
        if not nodes:
            result.device_indices = self._empty
            return
        values = [node.values[0] for node in nodes]
        last = nodes[-1]
        if path.node_offset < (len(last.key) >> 2):
            values[-1] = values[-1][: path.node_offset]
        result.device_indices = values[0] if len(values) == 1 else torch.cat(values)

    def alloc(
        self, num_tokens: int, source: Callable[[int], torch.Tensor | None] | None = None
    ) -> torch.Tensor | None:
        """Slots for ``num_tokens`` (whole pages) from the allocator, without evicting; held by
        the caller. ``source`` hands out this pool's slots instead (e.g. the hybrid
        allocator's alloc that also maps SWA pages)."""
        slots = (source or self.allocator.alloc)(num_tokens)
        if slots is not None:
            self.num_held += slots.shape[0]
        return slots

    def check_held(self, slots: torch.Tensor) -> None:
        """Raise ValueError if any of ``slots`` lies outside the pool or in a tree-owned page."""
        # NOTE: host slots through numpy (torch reductions cost ~4 us per free), and the range
        # in one compare (``outside``); min and max only for the message
        arr = slots.numpy() if slots.device.type == "cpu" else slots
        end = (self.allocator.num_pages + 1) * self.page_size  # page 0 is the padding
        if (outside(arr, self._num_slots) if isinstance(arr, np.ndarray) else
                bool(arr.numel()) and (int(arr.min()) < 0 or int(arr.max()) >= end)):
            lo, hi = int(arr.min()), int(arr.max())
            raise ValueError(f"slots {lo}..{hi} are outside the pool (valid 0..{end - 1}); "
                             "free only slots from alloc")
        if self.ownership.any_owned(arr):
            raise ValueError(
                "free of slots the tree owns (they came from match_prefix or were adopted by "
                "insert); free only slots from alloc that insert did not take"
            )

    def free(self, slots: torch.Tensor) -> None:
        """Return slots a request holds. Raises ValueError (nothing changes) for tree-owned
        slots, double frees or partial pages."""
        self.check_held(slots)
        self.allocator.free(slots)
        self.num_held -= slots.shape[0]

    def apply(self, effects: Effects) -> None:
        adopted, dropped, freed = effects.adopted[0], effects.dropped[0], effects.freed[0]
        # NOTE: dropped and freed slots are whole pages the tree knows are held: skipping
        # free()'s validation saves ~10 us per call (PagedAllocator and SWAFullSide have it).
        release = getattr(self.allocator, "free_trusted", self.allocator.free)
        if adopted:
            slots = adopted[0] if len(adopted) == 1 else torch.cat(adopted)
            self.ownership.mark(slots)
            self.num_held -= slots.shape[0]
        if dropped:
            slots = dropped[0] if len(dropped) == 1 else torch.cat(dropped)
            release(slots)
            self.num_held -= slots.shape[0]
        if freed:
            slots = freed[0] if len(freed) == 1 else torch.cat(freed)
            self.ownership.unmark(slots)
            release(slots)

    def check_accounting(self) -> None:
        total = self.allocator.total_size()
        free = self.allocator.available_size()
        assert self.num_held >= 0, f"full: negative held count {self.num_held}"
        assert free + self.cached_tokens + self.num_held == total, (
            f"full pool: free {free} + cached {self.cached_tokens} + held {self.num_held} "
            f"!= total {total}"
        )
        values = [n.values[0] for n in self.tree.iter_nodes() if n.values[0] is not None]
        pages = torch.cat(values)[:: self.page_size] // self.page_size if values else self._empty
        owned = self.ownership.owned_pages()
        assert torch.equal(torch.sort(pages).values, owned.to(pages.device)), (
            f"full pool: {owned.numel()} pages marked tree-owned, the tree holds "
            f"{pages.numel()} (or a different set)"
        )

    def stats(self) -> dict[str, Any]:
        return {
            "cached_tokens": self.cached_tokens,
            "protected_tokens": self.protected_tokens,
            "evictable_tokens": self.cached_tokens - self.protected_tokens,
            "held_tokens": self.num_held,
            "free_tokens": self.allocator.available_size(),
            "evictable_leaves": len(self.evictable),
        }

    # ---------------------------------------------------------------- linker (typed steps)

    def _offload_transfer(self, node: TreeNode) -> PoolTransfer | None:
        """The node's slots keyed by its page hashes (None without hashes or device data)."""
        if node.hash_value is None or node.values[0] is None:
            return None
        return PoolTransfer(name=PoolName.KV, keys=list(node.hash_value),
                            device_indices=node.values[0])

    def _reserve_load(self, keys: list[str]) -> PoolTransfer | None:
        """``len(keys)`` pages of fresh slots, evicting when short (None when even eviction
        cannot make room); they count as held until the publishing insert or ABORT."""
        num_tokens = len(keys) * self.page_size
        slots = alloc_or_evict(lambda: self._make_room(
            num_tokens - self.allocator.available_size()), self.alloc, num_tokens)
        if slots is None:
            return None
        return PoolTransfer(name=PoolName.KV, keys=list(keys), device_indices=slots)

    def abort_load(self, load: ComponentLoad) -> None:
        self.free(load.slots)
