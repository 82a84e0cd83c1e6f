"""The radix tree core: structure, walk, locks and eviction order. Re-exports only."""

from radixlink.tokens import token_bytes
from radixlink.tree.invariants import check_tree
from radixlink.tree.locks import LockHandle
from radixlink.tree.lru import EvictableSet
from radixlink.tree.node import Effects, InsertContext, MatchPath, NodeId, TreeNode
from radixlink.tree.protocol import Component
from radixlink.tree.tree import RadixTree

__all__ = [
    "Component",
    "Effects",
    "EvictableSet",
    "InsertContext",
    "LockHandle",
    "MatchPath",
    "NodeId",
    "RadixTree",
    "TreeNode",
    "check_tree",
    "token_bytes",
]
