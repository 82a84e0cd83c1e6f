"""``HybridSlots``: what a request holds beyond full-attention pages on a hybrid cache: the SWA
page mapped to each of its full pages, and Mamba state slots (fresh, or a copy of a cached
state: the explicit copy-on-write step after a match).

Owns these request-side calls only; the SWA and MAMBA components own the pools and their
eviction. Callers reach it as ``cache.hybrid`` (docs/tree.md, "Hybrid"); its allocations make
room through the facade's eviction path.
"""

from __future__ import annotations

from typing import Any

import torch

from radixlink.checks import check_slots
from radixlink.components.base import RoomFn, alloc_or_evict
from radixlink.tree.node import TreeNode


class HybridSlots:
    """Request-held SWA pages and Mamba state slots of one cache.

    Args:
        tree: the cache's tree (a copy locks its source while it makes room).
        full, swa, mamba: the cache's components (``swa`` / ``mamba`` None when absent).
        device: where slot tensors live.
        room: the facade's eviction path, ``EvictionPath.make_room(index, units)``.
    """

    def __init__(self, tree: Any, full: Any, swa: Any, mamba: Any, device: torch.device,
                 room: RoomFn):
        self.tree, self.device = tree, device
        self._full, self._swa, self._mamba = full, swa, mamba
        self._room = room

    def swa_slots(self, full_slots: torch.Tensor) -> torch.Tensor:
        """The SWA slot mapped to each full slot (0 where none is): where a request writes and
        reads SWA K/V for the tokens at ``full_slots``.

        Raises:
            ValueError: this cache has no SWA component, or malformed slots.
        """
        return _need(self._swa, "swa_slots").allocator.translate_full_to_swa(full_slots)

    def free_swa(self, full_slots: torch.Tensor) -> None:
        """Free the SWA pages mapped to the caller's whole full pages ``full_slots`` (tokens
        that left the window); the full pages stay the caller's. Unmapped pages are skipped.
        Pass the position below which all SWA pages are gone as ``swa_evicted_seqlen``.

        Raises:
            ValueError: no SWA component, tree-owned or malformed slots; nothing changes.
        """
        swa = _need(self._swa, "free_swa")
        check_slots("full_slots", full_slots, self.device)
        self._full.check_held(full_slots)
        swa.free_held(full_slots)

    def alloc_state(self) -> int | None:
        """A fresh request-held Mamba state slot (contents stale; zero it for a new sequence),
        evicting a cached state when none is free; None when all are held or locked.

        Raises:
            ValueError: this cache has no MAMBA component.
        """
        mamba = _need(self._mamba, "alloc_state")
        return alloc_or_evict(lambda: self._room(mamba.index, 1), mamba.alloc)

    def copy_state(self, node: TreeNode) -> int | None:
        """A fresh request-held state slot holding a copy of the state at ``node``'s end (the
        ``last_node`` of a non-empty match): copy-on-write, the explicit step after match.
        Evicts another cached state when none is free; None when even that fails. Lock
        ``node`` first (its state is then protected while others are evicted).

        Raises:
            ValueError: no MAMBA component, or ``node`` holds no state (evicted meanwhile:
                match again).
        """
        mamba = _need(self._mamba, "copy_state")
        if not isinstance(node, TreeNode) or node.seq_len < 0 or node.values[mamba.index] is None:
            raise ValueError(f"copy_state of {node!r}: it holds no state (evicted since the "
                             "match?); lock the match's last_node before copying")

        def make_room() -> None:
            handle = self.tree.lock(node)  # NOTE: the lock keeps this state while others go
            try:
                self._room(mamba.index, 1)
            finally:
                self.tree.unlock(handle)

        return alloc_or_evict(make_room, mamba.copy_state, node)

    def free_state(self, slot: int) -> None:
        """Return a request-held state slot (``alloc_state``, ``copy_state``).

        Raises:
            ValueError: no MAMBA component, a tree-owned slot or a double free.
        """
        _need(self._mamba, "free_state").free(slot)


def _need(component: Any, what: str) -> Any:
    if component is None:
        swa = "swa" in what
        name, setting = ("SWA", "sliding_window") if swa else ("MAMBA", "mamba_num_states")
        raise ValueError(f"{what}: this cache has no {name} component (set {setting})")
    return component
