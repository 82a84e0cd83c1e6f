"""Components: the kinds of cached state on the tree, behind one hook set. Re-exports only."""

from radixlink.components.base import SlotAllocator, TreeComponent
from radixlink.components.full import FullComponent
from radixlink.components.ownership import PageOwnership

__all__ = ["FullComponent", "PageOwnership", "SlotAllocator", "TreeComponent"]
