"""Device memory: page allocators, the SWA hybrid allocator, K/V and state pools, layouts.

Re-exports only; no logic here.
"""

from radixlink.memory.allocator import PagedAllocator
from radixlink.memory.layout import KVLayout, StateLayout
from radixlink.memory.pools import KVPool, MambaStatePool
from radixlink.memory.swa_allocator import SWAAllocator

__all__ = ["KVLayout", "KVPool", "MambaStatePool", "PagedAllocator", "SWAAllocator", "StateLayout"]
