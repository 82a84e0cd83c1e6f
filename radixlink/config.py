"""Frozen configuration records: ``CacheConfig`` and the eviction policy enum.

Owns validation of user-given sizes and modes. Builds nothing; ``UnifiedCache`` reads it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

from radixlink.hashing import HASH_ALGOS, Namespace
from radixlink.memory.layout import KVLayout


class EvictionPolicy(str, enum.Enum):
    """Which evictable node goes first: least recently used, or least frequently hit."""

    LRU = "lru"
    LFU = "lfu"


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"CacheConfig.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheConfig:
    """How to build a ``UnifiedCache``.

    Attributes:
        page_size: tokens per page (the unit of allocation, matching and hashing).
        num_tokens: usable device slots of the full pool, a multiple of ``page_size``.
        device: where slot tensors (and KV tensors, with a layout) live.
        kv_layout: the full-attention KV layout; None manages indices only (no KV tensors),
            as index-structure benchmarks need.
        namespace: the cache-wide namespace (model + layout fingerprints); requests may pass
            their own (cache_salt, extra_key) on insert and match. Namespaces never share
            prefixes.
        eviction_policy: ``"lru"`` (default) or ``"lfu"``.
        enable_external_cache_linker: compute page hashes on insert and allow
            ``attach_linker``; off means no hashing cost and no behaviour change.
        hash_algo: page hash function when hashing is on (``"sha256"`` or ``"xxh3"``).
    """

    page_size: int
    num_tokens: int
    device: str | torch.device = "cpu"
    kv_layout: KVLayout | None = None
    namespace: Namespace | None = None
    eviction_policy: EvictionPolicy | str = EvictionPolicy.LRU
    enable_external_cache_linker: bool = False
    hash_algo: str = "sha256"

    def __post_init__(self) -> None:
        _positive_int("page_size", self.page_size)
        _positive_int("num_tokens", self.num_tokens)
        if self.num_tokens % self.page_size:
            hint = self.num_tokens // self.page_size * self.page_size or self.page_size
            raise ValueError(
                f"CacheConfig.num_tokens={self.num_tokens} is not a multiple of "
                f"page_size={self.page_size}; use {hint}"
            )
        try:
            policy = EvictionPolicy(self.eviction_policy)
        except ValueError:
            raise ValueError(
                f"CacheConfig.eviction_policy must be 'lru' or 'lfu', got {self.eviction_policy!r}"
            ) from None
        # NOTE: frozen dataclass; normalising the string form keeps comparisons exact.
        object.__setattr__(self, "eviction_policy", policy)
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError):
            raise ValueError(f"CacheConfig.device is not a torch device: {self.device!r}") from None
        if self.kv_layout is not None:
            if not isinstance(self.kv_layout, KVLayout):
                raise ValueError(
                    f"CacheConfig.kv_layout must be a KVLayout or None, got {self.kv_layout!r}"
                )
            if self.kv_layout.page_size != self.page_size:
                raise ValueError(
                    f"kv_layout.page_size={self.kv_layout.page_size} differs from "
                    f"page_size={self.page_size}"
                )
        if self.namespace is not None and not isinstance(self.namespace, Namespace):
            raise ValueError(f"CacheConfig.namespace must be a Namespace, got {self.namespace!r}")
        if not isinstance(self.enable_external_cache_linker, bool):
            raise ValueError(
                "CacheConfig.enable_external_cache_linker must be a bool, got "
                f"{self.enable_external_cache_linker!r}"
            )
        if self.hash_algo not in HASH_ALGOS:
            raise ValueError(
                f"CacheConfig.hash_algo must be one of {HASH_ALGOS}, got {self.hash_algo!r}"
            )

    @property
    def hashing_enabled(self) -> bool:
        """Whether nodes carry page hashes (needed only by the external cache linker)."""
        return self.enable_external_cache_linker

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly summary (for stats and benchmark output)."""
        return {
            "page_size": self.page_size,
            "num_tokens": self.num_tokens,
            "device": str(self.device),
            "kv_layout": None if self.kv_layout is None else self.kv_layout.fingerprint(),
            "eviction_policy": EvictionPolicy(self.eviction_policy).value,
            "enable_external_cache_linker": self.enable_external_cache_linker,
        }
