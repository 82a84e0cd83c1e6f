"""Frozen configuration records: ``CacheConfig`` (full, SWA and Mamba sizes) and the eviction
policy enum.

Owns validation of user-given sizes and modes. Builds nothing; ``UnifiedCache`` reads it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

from radixlink.contract import ComponentType
from radixlink.hashing import HASH_ALGOS, Namespace, check_no_separator
from radixlink.memory.layout import KVLayout, StateLayout


class EvictionPolicy(str, enum.Enum):
    """Which evictable node goes first: least recently used, or least frequently hit."""

    LRU = "lru"
    LFU = "lfu"


def _check_layout(name: str, layout: object, kind: type, page_size: int) -> None:
    if layout is None:
        return
    if not isinstance(layout, kind):
        raise ValueError(f"CacheConfig.{name} must be a {kind.__name__} or None, got {layout!r}")
    if isinstance(layout, KVLayout) and layout.page_size != page_size:
        raise ValueError(
            f"CacheConfig.{name}.page_size={layout.page_size} differs from page_size={page_size}"
        )


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
        sliding_window: the attention window ``W`` (tokens) of SWA layers; None = no SWA
            component. Window pages are ``ceil(W / page_size)``.
        swa_num_tokens: usable slots of the SWA pool (a multiple of ``page_size``); None =
            ``num_tokens``. Needs ``sliding_window``.
        swa_layout: the SWA pool's KV layout; None manages SWA indices only.
        mamba_num_states: usable recurrent-state slots; None = no MAMBA component.
        state_layout: the shape of one state slot; None manages state indices only.
        check_inserts: validate every insert's slots (held, distinct, aligned, in range; the
            prefix the tree's own) before anything changes. On by default; an engine whose
            slot handling is itself verified may turn it off (a few µs per insert, see
            docs/benchmarks.md), and then a bad slot corrupts the cache silently.
    """

    page_size: int
    num_tokens: int
    device: str | torch.device = "cpu"
    kv_layout: KVLayout | None = None
    namespace: Namespace | None = None
    eviction_policy: EvictionPolicy | str = EvictionPolicy.LRU
    enable_external_cache_linker: bool = False
    hash_algo: str = "sha256"
    sliding_window: int | None = None
    swa_num_tokens: int | None = None
    swa_layout: KVLayout | None = None
    mamba_num_states: int | None = None
    state_layout: StateLayout | None = None
    check_inserts: bool = True

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
        if self.namespace is not None:
            for name, value in zip(("model", "layout", "cache_salt", "extra_key"),
                                   self.namespace.parts(), strict=True):
                check_no_separator(f"CacheConfig.namespace.{name}", value)
        if not isinstance(self.enable_external_cache_linker, bool):
            raise ValueError(
                "CacheConfig.enable_external_cache_linker must be a bool, got "
                f"{self.enable_external_cache_linker!r}"
            )
        if not isinstance(self.check_inserts, bool):
            raise ValueError(
                f"CacheConfig.check_inserts must be a bool, got {self.check_inserts!r}"
            )
        if self.hash_algo not in HASH_ALGOS:
            raise ValueError(
                f"CacheConfig.hash_algo must be one of {HASH_ALGOS}, got {self.hash_algo!r}"
            )
        self._check_hybrid()

    def _check_hybrid(self) -> None:
        if self.sliding_window is None:
            for name in ("swa_num_tokens", "swa_layout"):
                if getattr(self, name) is not None:
                    raise ValueError(f"CacheConfig.{name} needs sliding_window (the SWA window)")
        else:
            _positive_int("sliding_window", self.sliding_window)
            if self.swa_num_tokens is not None:
                _positive_int("swa_num_tokens", self.swa_num_tokens)
                if self.swa_num_tokens % self.page_size:
                    raise ValueError(
                        f"CacheConfig.swa_num_tokens={self.swa_num_tokens} is not a multiple "
                        f"of page_size={self.page_size}"
                    )
            _check_layout("swa_layout", self.swa_layout, KVLayout, self.page_size)
        if self.mamba_num_states is None:
            if self.state_layout is not None:
                raise ValueError("CacheConfig.state_layout needs mamba_num_states")
        else:
            _positive_int("mamba_num_states", self.mamba_num_states)
            _check_layout("state_layout", self.state_layout, StateLayout, self.page_size)

    @property
    def swa_pool_tokens(self) -> int:
        """Usable SWA slots (``swa_num_tokens``, defaulting to ``num_tokens``)."""
        return self.num_tokens if self.swa_num_tokens is None else self.swa_num_tokens

    @property
    def component_types(self) -> tuple[ComponentType, ...]:
        """The cache's components, backbone first: FULL, then SWA and MAMBA when configured."""
        out = [ComponentType.FULL]
        if self.sliding_window is not None:
            out.append(ComponentType.SWA)
        if self.mamba_num_states is not None:
            out.append(ComponentType.MAMBA)
        return tuple(out)

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
            "components": [c.value for c in self.component_types],
            "sliding_window": self.sliding_window,
            "swa_num_tokens": None if self.sliding_window is None else self.swa_pool_tokens,
            "mamba_num_states": self.mamba_num_states,
        }
