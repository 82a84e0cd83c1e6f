"""``TreeComponent``: the one hook set through which the tree and the facade reach a component.

Owns default behaviour (a component that caches nothing) and the linker hooks' defaults of
DESIGN.md section 3. Concrete components (full.py, swa.py, mamba.py) override hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

import torch

from radixlink.contract import (
    ComponentType,
    ExternalLinkerLoadPhase,
    InsertResult,
    LinkerTransferPhase,
    MatchResult,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from radixlink.tree.node import Effects, InsertContext, MatchPath, TreeNode
from radixlink.tree.protocol import TreeOps

RoomFn = Callable[[int, int], None]
"""``make_room(component_index, units)``: the facade's one eviction path (evict, then apply)."""

T = TypeVar("T")


def alloc_or_evict(make_room: Callable[[], None], alloc: Callable[..., T | None],
                   *args: Any) -> T | None:
    """The one "try, make room, retry" of every allocation that may evict: ``alloc(*args)``;
    when it gives None, ``make_room()`` (through the facade's eviction path, ``EvictionPath``)
    and ``alloc(*args)`` once more. None when even eviction could not make room."""
    got = alloc(*args)
    if got is None:
        make_room()
        got = alloc(*args)
    return got


class SlotAllocator(Protocol):
    """What a component needs from its pool's allocator (``PagedAllocator`` fits; a hybrid
    allocator can be wrapped to fit)."""

    page_size: int
    device: torch.device
    num_pages: int

    def alloc(self, num_tokens: int) -> torch.Tensor | None: ...

    def free(self, slots: torch.Tensor) -> None: ...

    def available_size(self) -> int: ...

    def total_size(self) -> int: ...


@dataclass(slots=True, kw_only=True)
class ComponentLoad:
    """One component's part of one store load: ``prepare_load`` returns it (LOAD + PREPARE), the
    publishing insert takes its slots, or ``abort_load`` takes it back (the typed form of
    DESIGN.md's PREPARE / ABORT; COMMIT has nothing left to do: the insert adopted or freed
    every reserved slot).

    Attributes:
        transfer: the pool's keys and the device slots reserved for them (held until then).
        prefix_len: tokens on device before the loaded tail.
        full: the backbone's reserved slots for the whole tail (FULL: its own transfer).
        insert: the ``InsertParams`` fields the publishing insert takes from this load (SWA:
            ``swa_evicted_seqlen``; MAMBA: ``mamba_value``), set by PREPARE.
    """

    transfer: PoolTransfer
    prefix_len: int
    full: PoolTransfer
    insert: dict[str, Any] = field(default_factory=dict)

    @property
    def slots(self) -> torch.Tensor:
        """The reserved device slots (``transfer.device_indices``)."""
        assert self.transfer.device_indices is not None, "a load transfer without slots"
        return self.transfer.device_indices


class TreeComponent:
    """Base of every component; the defaults describe a component that holds no data.

    Hooks fall in four groups (the tree calls the first three, the facade the last):

    * structure: ``bind``, ``split``, ``refresh``, ``keeps_leaf``, ``release``;
    * requests: ``match_accept``, ``insert_overlap``, ``insert_unevict``, ``insert_leaf``,
      ``insert_done``, ``lock``/``unlock``, ``evict``;
    * checks: ``check_node``, ``check``;
    * facade: ``fill_match`` (its part of a ``MatchResult``), ``apply`` (slot decisions of an
      ``Effects`` record), ``check_accounting``, ``stats``;
    * linker: ``prepare_load`` / ``abort_load`` over a ``ComponentLoad``, and the two DESIGN.md
      hooks as adapters over them; a load's pool is ``pool_name`` (its hit policy
      ``hit_policy``, its trailing pages ``window_pages``) when ``takes_part_in_loads``.

    A component stores its data in ``node.values[self.index]`` (None = tombstone) and its lock
    count in ``node.lock_refs[self.index]``; index 0 is the backbone. Components may read
    other components' slots of a node (e.g. SWA heals into the backbone value), never their
    private state.
    """

    component_type: ClassVar[ComponentType]
    pool_name: ClassVar[PoolName]
    layout_setting: ClassVar[str] = ""  # the CacheConfig field whose layout gives the pool data
    hit_policy: ClassVar[PoolHitPolicy] = PoolHitPolicy.ALL_PAGES
    # Whether LOAD reserves device slots for this component (a LOAD transfer of None is then a
    # refusal: the load is a miss); False = it takes no part in loads.
    takes_part_in_loads: ClassVar[bool] = False
    # TRAILING_PAGES components: how many trailing pages a restorable prefix needs (SWA: its
    # ``Window.pages``; MAMBA: 1); 0 = all pages. Read by the linker's LOOKUP.
    window_pages: int = 0

    def __init__(self) -> None:
        self.index = -1
        self._tree: TreeOps | None = None
        self._room: RoomFn | None = None

    @property
    def tree(self) -> TreeOps:
        assert self._tree is not None, f"{type(self).__name__} is not bound to a tree"
        return self._tree

    # ---------------------------------------------------------------- structure (tree calls)

    def bind(self, tree: TreeOps, index: int) -> None:
        """Attach to ``tree`` at slot ``index`` (called once, by the tree)."""
        assert self._tree is None, f"{type(self).__name__} is already bound to a tree"
        self._tree, self.index = tree, index

    def bind_room(self, room: RoomFn) -> None:
        """Attach the facade's eviction path (called once, by the facade)."""
        self._room = room

    def _make_room(self, units: int) -> None:
        """Ask the facade to evict until ``units`` more of this component's units are free
        (tokens, or states); it evicts, then applies the slot decisions, in one place."""
        if units > 0:
            assert self._room is not None, f"{type(self).__name__} has no eviction path bound"
            self._room(self.index, units)

    def split(self, parent: TreeNode, child: TreeNode) -> None:
        """Divide this component's value and locks of ``child`` with its new front ``parent``."""

    def refresh(self, node: TreeNode) -> None:
        """Re-decide ``node``'s evictable membership after a leaf or lock change."""

    def keeps_leaf(self, node: TreeNode) -> bool:
        """Whether ``node`` is still useful to this component as a leaf; the tree removes an
        unlocked leaf (after eviction) when some component says no. Default: yes."""
        return True

    def release(self, node: TreeNode, effects: Effects) -> None:
        """Release this component's data on ``node`` into ``effects`` (the node leaves the tree
        or becomes this component's tombstone); set ``node.values[self.index] = None``."""

    # ---------------------------------------------------------------- requests (tree calls)

    def match_accept(self, nodes: list[TreeNode], limit: int) -> int:
        """Largest boundary ``<= limit`` this component can serve along ``nodes``."""
        return limit

    def check_prefix(self, nodes: list[TreeNode], value: torch.Tensor, prev: int) -> str | None:
        """Backbone only: why ``value[:prev]`` is not the tree's own data along ``nodes``."""
        return None

    def insert_overlap(self, ctx: InsertContext, node: TreeNode, start: int, end: int) -> None:
        """The key covers ``node`` where this component has data."""

    def insert_unevict(self, ctx: InsertContext, node: TreeNode, start: int, end: int) -> None:
        """The key covers ``node`` where this component's value is a tombstone."""

    def insert_leaf(self, ctx: InsertContext, node: TreeNode, start: int, end: int) -> None:
        """Commit the caller's data ``[start, end)`` (all of it) for the new leaf ``node``."""

    def insert_done(self, ctx: InsertContext, last_node: TreeNode) -> None:
        """After the walk; ``last_node`` ends at ``ctx.aligned_len``."""

    def lock(self, node: TreeNode) -> Any:
        """Protect what a request at ``node`` needs; the return value is this component's
        receipt, handed back to ``unlock``."""
        return None

    def unlock(self, node: TreeNode, receipt: Any) -> None:
        """Undo the ``lock`` that returned ``receipt``."""

    def evict(self, target: int, effects: Effects) -> None:
        """Free data until ``effects.num_freed[self.index] >= target`` or none is left."""

    # ---------------------------------------------------------------- checks (tree calls)

    def check_node(self, node: TreeNode) -> int:
        """Assert per-node rules; return this component's units (tokens/states) on ``node``."""
        return 0

    def check(self, cached: int, handles: list[Any]) -> None:
        """Assert component-wide rules (``cached`` = sum of ``check_node`` over the tree)."""

    # ---------------------------------------------------------------- facade

    def fill_match(self, result: MatchResult, path: MatchPath) -> None:
        """Write this component's part of ``result`` for the accepted ``path``."""

    def apply(self, effects: Effects) -> None:
        """Carry out the slot decisions for this component in ``effects`` (free, mark).

        Callers apply in reverse component order (dependents before the backbone), the same
        order in which the tree releases a node's data."""

    def check_accounting(self) -> None:
        """Assert the pool's free + cached + held == total."""

    def stats(self) -> dict[str, Any]:
        return {}

    # ---------------------------------------------------------------- linker (DESIGN.md 3)
    #
    # The typed load protocol, what the linker's loader calls: ``prepare_load`` returns this
    # component's ``ComponentLoad``, the publishing insert takes its slots (and its ``insert``
    # fields), ``abort_load`` takes it back. The two DESIGN.md hooks below are thin adapters over
    # the same steps. Components override the private steps (``_offload_transfer``,
    # ``_reserve_load``, ``_map_load``) and ``abort_load``.

    def prepare_load(self, keys: list[str], prefix_len: int,
                     full: PoolTransfer | None) -> ComponentLoad | None:
        """LOAD + PREPARE: reserve device slots for the tail pages ``keys`` after ``prefix_len``
        device tokens (evicting when short) and set this component's mappings; None, holding
        nothing, when it cannot. ``full`` is the backbone's prepared transfer (None: this is
        the backbone, which prepares first)."""
        transfer = self._reserve_load(keys)
        if transfer is None:
            return None
        load = ComponentLoad(transfer=transfer, prefix_len=prefix_len,
                             full=transfer if full is None else full)
        load.insert = self._map_load(load)
        return load

    def abort_load(self, load: ComponentLoad) -> None:
        """The load failed before publishing: release every slot and mapping ``load`` holds."""

    def _offload_transfer(self, node: TreeNode) -> PoolTransfer | None:
        """OFFLOAD: ``node``'s data keyed by its page hashes, or None (nothing to export)."""
        return None

    def _reserve_load(self, keys: list[str]) -> PoolTransfer | None:
        """LOAD: fresh held slots for the tail pages ``keys`` (evicting when short), or None."""
        return None

    def _map_load(self, load: ComponentLoad) -> dict[str, Any]:
        """PREPARE: set the mappings of ``load``'s slots before data lands; returns the
        ``InsertParams`` fields the publishing insert takes from this load (default: none)."""
        return {}

    def build_external_linker_transfer(
        self, phase: LinkerTransferPhase, node: TreeNode | None, keys: list[str]
    ) -> PoolTransfer | None:
        """This component's part of a linker transfer, or None = not taking part.

        OFFLOAD: ``node`` is given and ``keys`` come from ``node.hash_value``. LOOKUP/LOAD:
        ``node`` is None and ``keys`` are the hashes of the device-uncached tail (page 0 =
        first uncached page). LOAD reserves device slots the component owns until
        ``update_external_linker_load`` COMMITs or ABORTs them (``prepare_load``'s first step).
        """
        if phase is LinkerTransferPhase.OFFLOAD:
            return None if node is None else self._offload_transfer(node)
        if not self.takes_part_in_loads:
            return None
        if phase is LinkerTransferPhase.LOOKUP:
            return PoolTransfer(name=self.pool_name, keys=list(keys), hit_policy=self.hit_policy)
        return self._reserve_load(keys)

    def update_external_linker_load(
        self,
        phase: ExternalLinkerLoadPhase,
        req: Any,
        full_transfer: PoolTransfer | None,
        transfer: PoolTransfer | None,
        prefix_len: int,
        *,
        insert_result: InsertResult | None = None,
    ) -> PoolTransfer | None:
        """Advance a load of this component (an adapter over the typed steps): PREPARE (set
        mappings before data lands, and the insert fields the load brings on ``req``, the
        engine's request record, where it has them), COMMIT (after the publishing insert,
        which already adopted or freed every reserved slot: nothing to do), ABORT (release
        what LOAD reserved; returns None)."""
        if transfer is None or transfer.device_indices is None:
            return transfer
        load = ComponentLoad(transfer=transfer, prefix_len=prefix_len,
                             full=transfer if full_transfer is None else full_transfer)
        if phase is ExternalLinkerLoadPhase.PREPARE:
            for name, value in self._map_load(load).items():
                if hasattr(req, name):
                    setattr(req, name, value)
        elif phase is ExternalLinkerLoadPhase.ABORT:
            self.abort_load(load)
            return None
        else:
            assert insert_result is not None, "COMMIT needs the insert's result"
        return transfer
