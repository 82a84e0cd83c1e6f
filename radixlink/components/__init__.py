"""Components: the kinds of cached state on the tree, behind one hook set. Re-exports only."""

from radixlink.components.assembly import Components, Memory, build_components, build_memory
from radixlink.components.base import SlotAllocator, TreeComponent
from radixlink.components.full import FullComponent, PageOwnership
from radixlink.components.mamba import MambaComponent
from radixlink.components.swa import SWAComponent
from radixlink.memory.states import StateSlots
from radixlink.memory.swa_allocator import SWAFullSide

__all__ = [
    "Components",
    "FullComponent",
    "MambaComponent",
    "Memory",
    "PageOwnership",
    "SWAComponent",
    "SWAFullSide",
    "SlotAllocator",
    "StateSlots",
    "TreeComponent",
    "build_components",
    "build_memory",
]
