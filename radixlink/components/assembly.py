"""Build a cache's memory (allocators, pools) and components from a ``CacheConfig``.

Owns the wiring only: which allocator backs which component, which pools exist. Holds no state
after building; ``UnifiedCache`` and ``NoPrefixCache`` keep what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from radixlink.components.base import TreeComponent
from radixlink.components.full import FullComponent
from radixlink.components.mamba import MambaComponent
from radixlink.components.swa import SWAComponent
from radixlink.config import CacheConfig
from radixlink.contract import PoolName
from radixlink.memory.allocator import PagedAllocator
from radixlink.memory.pools import KVPool, MambaStatePool
from radixlink.memory.states import StateSlots
from radixlink.memory.swa_allocator import SWAAllocator, SWAFullSide


@dataclass(slots=True)
class Memory:
    """A cache's device memory.

    Attributes:
        full: the full-attention allocator.
        hybrid: the SWA hybrid allocator (wraps ``full``), or None without SWA.
        states: Mamba state slots (a ``MambaStatePool`` with a layout), or None.
        pools: the tensors behind each pool name (None where indices only).
    """

    full: PagedAllocator
    hybrid: SWAAllocator | None = None
    states: MambaStatePool | StateSlots | None = None
    pools: dict[PoolName, Any] = field(default_factory=dict)


def build_memory(config: CacheConfig, device: torch.device) -> Memory:
    """Allocators and pools for ``config`` on ``device``.

    Raises:
        ValueError: the sizes need more memory than ``device`` can give.
    """
    try:
        return _build_memory(config, device)
    except (MemoryError, RuntimeError) as exc:
        # NOTE: numpy raises MemoryError, torch a RuntimeError ("can't allocate memory") on
        # CPU and torch.OutOfMemoryError (a RuntimeError) on CUDA; anything else re-raises.
        if not isinstance(exc, MemoryError) and "alloc" not in str(exc).lower() \
                and not isinstance(exc, torch.OutOfMemoryError):
            raise
        raise ValueError(
            f"cannot allocate the cache's memory on {device} for num_tokens="
            f"{config.num_tokens}, swa_num_tokens={config.swa_num_tokens}, mamba_num_states="
            f"{config.mamba_num_states} ({type(exc).__name__}); pass smaller sizes"
        ) from None


def _build_memory(config: CacheConfig, device: torch.device) -> Memory:
    ps = config.page_size
    full = PagedAllocator(config.num_tokens, ps, device)
    memory = Memory(full=full)
    layout = config.kv_layout
    memory.pools[PoolName.KV] = None if layout is None else KVPool(layout, full.num_slots, device)
    if config.sliding_window is not None:
        swa = PagedAllocator(config.swa_pool_tokens, ps, device)
        memory.hybrid = SWAAllocator(full, swa)
        swa_layout = config.swa_layout
        memory.pools[PoolName.SWA] = (
            None if swa_layout is None else KVPool(swa_layout, swa.num_slots, device)
        )
    if config.mamba_num_states is not None:
        num, state_layout = config.mamba_num_states, config.state_layout
        memory.states = (
            StateSlots(num) if state_layout is None else MambaStatePool(num, state_layout, device)
        )
        memory.pools[PoolName.MAMBA] = None if state_layout is None else memory.states
    return memory


@dataclass(slots=True)
class Components:
    """The components of one tree: FULL always, SWA and MAMBA when configured."""

    full: FullComponent
    swa: SWAComponent | None = None
    mamba: MambaComponent | None = None

    @property
    def ordered(self) -> tuple[TreeComponent, ...]:
        """Backbone first, then SWA, then MAMBA (the tree's component indices)."""
        parts: list[TreeComponent] = [self.full]
        if self.swa is not None:
            parts.append(self.swa)
        if self.mamba is not None:
            parts.append(self.mamba)
        return tuple(parts)


def build_components(config: CacheConfig, memory: Memory) -> Components:
    """The components over ``memory`` (from ``build_memory(config, ...)``)."""
    policy = config.eviction_policy
    if memory.hybrid is None:
        parts = Components(full=FullComponent(memory.full, policy))
    else:
        assert config.sliding_window is not None, "an SWA allocator without a window"
        parts = Components(
            full=FullComponent(SWAFullSide(memory.hybrid), policy),
            swa=SWAComponent(
                memory.hybrid, config.sliding_window, policy, memory.pools.get(PoolName.SWA)
            ),
        )
    if memory.states is not None:
        parts.mamba = MambaComponent(memory.states, policy)
    return parts
