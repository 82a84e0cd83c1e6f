"""``EvictionPath``: the one way cached data leaves the device — the tree decides (``Effects``),
then every component applies the slot decisions, dependents first — and what left, per pool.

Owns eviction targets and counters. Used by the ``UnifiedCache`` facade and, through
``TreeComponent._make_room``, by components that must make room (a linker LOAD reserving slots).
"""

from __future__ import annotations

from collections.abc import Sequence

from radixlink.checks import check_count
from radixlink.components.base import TreeComponent
from radixlink.contract import ComponentType, EvictParams, EvictResult
from radixlink.tree.node import Effects
from radixlink.tree.tree import RadixTree

_SWA, _MAMBA = ComponentType.SWA, ComponentType.MAMBA


class EvictionPath:
    """Evict, then apply, in one place.

    Args:
        tree: the tree that picks victims.
        components: its components, backbone first (they apply in reverse order, the order in
            which the tree releases a node's data).
    """

    def __init__(self, tree: RadixTree, components: Sequence[TreeComponent]):
        self.tree = tree
        self._components = tuple(components)
        self._apply_order = self._components[::-1]
        self._by_type = {c.component_type: c.index for c in self._components}
        self.num_evicted = [0] * len(self._components)  # units freed per component
        for component in self._components:
            component.bind_room(self.make_room)

    def targets(self, **units: int) -> list[int]:
        """Per component index, the units to free: ``targets(full=..., swa=..., mamba=...)``.

        Raises:
            ValueError: a positive target for a component this cache does not have.
        """
        out = [0] * len(self._components)
        for name, num in units.items():
            index = self._by_type.get(ComponentType(name))
            if index is not None:
                out[index] = num
            elif num > 0:
                kind = name.upper()
                raise ValueError(f"an eviction target for {kind} but this cache has no {kind}")
        return out

    def evict_params(self, params: EvictParams) -> EvictResult:
        """``UnifiedCache.evict(EvictParams)``: per-pool targets in, per-pool freed units out.

        Raises:
            ValueError: a negative or non-int target, or one for a pool this cache lacks.
        """
        freed = self.evict(self.targets(
            full=check_count("num_tokens", params.num_tokens),
            swa=check_count("swa_num_tokens", params.swa_num_tokens),
            mamba=check_count("mamba_num", params.mamba_num),
        )).num_freed
        index = self._by_type
        return EvictResult(
            num_tokens_evicted=freed[0],
            swa_num_tokens_evicted=freed[index[_SWA]] if _SWA in index else 0,
            mamba_num_evicted=freed[index[_MAMBA]] if _MAMBA in index else 0,
        )

    def evict(self, targets: Sequence[int]) -> Effects:
        """Free at least ``targets[i]`` units of component ``i`` (as far as unlocked data
        allows), apply the slot decisions, and count what was freed (cascades included)."""
        effects = self.tree.evict(targets)
        self.apply(effects)
        for i, num in enumerate(effects.num_freed):
            self.num_evicted[i] += num
        return effects

    def make_room(self, index: int, units: int) -> None:
        """Free ``units`` of component ``index`` (nothing when ``units <= 0``): the facade's
        ``alloc`` and hybrid calls, and ``TreeComponent._make_room``."""
        if units <= 0:
            return
        targets = [0] * len(self._components)
        targets[index] = units
        self.evict(targets)

    def apply(self, effects: Effects) -> None:
        """Carry out a tree call's slot decisions (an insert's or an eviction's)."""
        for component in self._apply_order:
            component.apply(effects)
