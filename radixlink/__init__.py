"""radixlink: a radix prefix cache over paged KV memory, linked to external stores.

Re-exports only.
"""

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import (
    ComponentType,
    EvictParams,
    EvictResult,
    ExternalLinkerLoadPhase,
    InsertParams,
    InsertResult,
    LinkerTransferPhase,
    MatchResult,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)
from radixlink.errors import StoreError, TransferError
from radixlink.hashing import Namespace, page_hashes
from radixlink.linker.core import ExternalCacheLinker
from radixlink.linker.outcomes import LoadOutcome
from radixlink.memory import KVLayout, KVPool, MambaStatePool, PagedAllocator, StateLayout
from radixlink.nocache import NoPrefixCache
from radixlink.stores import PageCodec, Store, open_store

__all__ = [
    "CacheConfig",
    "ExternalCacheLinker",
    "LoadOutcome",
    "NoPrefixCache",
    "UnifiedCache",
    "ComponentType",
    "EvictParams",
    "EvictResult",
    "ExternalLinkerLoadPhase",
    "InsertParams",
    "InsertResult",
    "KVLayout",
    "KVPool",
    "LinkerTransferPhase",
    "MambaStatePool",
    "MatchResult",
    "PageCodec",
    "Namespace",
    "PagedAllocator",
    "PoolHitPolicy",
    "PoolName",
    "PoolTransfer",
    "PoolTransferResult",
    "StateLayout",
    "Store",
    "StoreError",
    "TransferError",
    "open_store",
    "page_hashes",
]
