"""The public contract of DESIGN.md section 3: enums and records that cross module boundaries.

Owns only plain data types. Must not import anything else from radixlink (everyone imports it).
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass, field
from typing import Any

import torch


class ComponentType(str, enum.Enum):
    """A kind of cached state on the tree."""

    FULL = "full"
    SWA = "swa"
    MAMBA = "mamba"


class PoolName(str, enum.Enum):
    """The memory a component uses."""

    KV = "kv"
    SWA = "swa"
    MAMBA = "mamba"


class PoolHitPolicy(str, enum.Enum):
    """Which pages of a prefix a pool needs present to restore it.

    ALL_PAGES: every page of the prefix. TRAILING_PAGES: only the last ``len(keys)`` pages
    (the SWA window; the Mamba state is one trailing page).
    """

    ALL_PAGES = "all_pages"
    TRAILING_PAGES = "trailing_pages"


class LinkerTransferPhase(str, enum.Enum):
    """What a linker transfer does: ask the store, bring pages in, or export pages."""

    LOOKUP = "lookup"
    LOAD = "load"
    OFFLOAD = "offload"


class ExternalLinkerLoadPhase(str, enum.Enum):
    """Steps of a load: reserve before data lands, bind after insert, or release on failure."""

    PREPARE = "prepare"
    COMMIT = "commit"
    ABORT = "abort"


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolTransfer:
    """One pool's part of a linker transfer.

    Attributes:
        name: the pool.
        keys: one store key (page hash) per page, page 0 first.
        device_indices: int64 slots, ``len(keys) * page_size`` of them (one state slot for
            MAMBA), or None for LOOKUP. The component that built the transfer owns them until
            COMMIT or ABORT.
        hit_policy: how presence of ``keys`` turns into restorable prefix lengths.
    """

    name: PoolName
    keys: list[str]
    device_indices: torch.Tensor | None = None
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolTransferResult:
    """What a store lookup returns for one request.

    ``restorable_prefix_pages`` lists, ascending, **every** prefix length (in pages, counted
    from the first device-uncached page) at which all pools can restore. It is sparse with
    trailing pools. Ranks intersect these sets; they never take a per-rank maximum.
    """

    restorable_prefix_pages: list[int]

    @property
    def best(self) -> int:
        """The largest restorable length in pages, 0 when nothing is restorable."""
        return self.restorable_prefix_pages[-1] if self.restorable_prefix_pages else 0


@dataclass(frozen=True, slots=True, kw_only=True)
class InsertParams:
    """Arguments of ``insert``.

    Attributes:
        key: tokens of the sequence (list, array or tensor of ints).
        value: full-pool slots for the first ``len(value)`` tokens of the key (int64); only
            whole pages are cached, the caller frees its partial tail page.
        prev_prefix_len: tokens the caller already took from the tree (its slots there are the
            tree's own and are never freed). Page aligned.
        swa_evicted_seqlen: tokens below which the caller already released its SWA slots.
        mamba_value: state slot at the key's end, or None.
        chunked: a chunked-prefill insert; does not count as a hit.
        track_adopted_ranges: fill ``InsertResult.adopted_ranges``.
        namespace: isolation parts (model, layout, cache_salt, extra_key), or None.
    """

    key: Any
    value: torch.Tensor
    prev_prefix_len: int = 0
    swa_evicted_seqlen: int = 0
    mamba_value: int | None = None
    chunked: bool = False
    track_adopted_ranges: bool = False
    namespace: Any = None


@dataclass(slots=True, kw_only=True)
class InsertResult:
    """What ``insert`` did.

    Attributes:
        prefix_len: tokens of the key that were already in the tree before this insert.
        last_node: the node where the inserted key ends.
        adopted_ranges: per component, half-open absolute token ranges ``[start, end)`` whose
            caller slots the tree took ownership of (filled only with tracking on).
    """

    prefix_len: int
    last_node: Any = None
    adopted_ranges: dict[ComponentType, list[tuple[int, int]]] = field(default_factory=dict)

    def record_adopted_range(self, component: ComponentType, start: int, end: int) -> None:
        """Add ``[start, end)`` for ``component``, merging it with every recorded range it
        touches or overlaps; ranges stay sorted and disjoint whatever order they come in
        (usually in key order, when this is one append or one merge with the last range).

        Raises:
            ValueError: for a negative start or a reversed range.
        """
        if start < 0 or end < start:
            raise ValueError(
                f"adopted range [{start}, {end}) is invalid for {component}: "
                "expected 0 <= start <= end"
            )
        if start == end:
            return
        ranges = self.adopted_ranges.setdefault(component, [])
        if not ranges or start > ranges[-1][1]:  # the common case: past every range
            ranges.append((start, end))
            return
        # Ranges are sorted and disjoint: merge the run of those touching [start, end).
        lo = bisect.bisect_left(ranges, start, key=lambda r: r[1])
        hi = bisect.bisect_right(ranges, end, key=lambda r: r[0])
        if lo < hi:
            start, end = min(start, ranges[lo][0]), max(end, ranges[hi - 1][1])
        ranges[lo:hi] = [(start, end)]

    def adopted_tokens(self, component: ComponentType) -> int:
        """Total tokens adopted for ``component``."""
        return sum(end - start for start, end in self.adopted_ranges.get(component, ()))


@dataclass(slots=True, kw_only=True)
class MatchResult:
    """The longest cached prefix of a key.

    Attributes:
        device_indices: full-pool slots of the matched prefix (int64, ``prefix_len`` long).
            The tree owns them; lock ``last_node`` before using them past the next evict.
        prefix_len: matched tokens (page aligned).
        last_node: the node where the match ended (the root for an empty match).
        node_offset: tokens of ``last_node``'s key that the match covers (the match may end
            inside a node; match never splits).
        swa_indices: SWA slots of the matched window (SWA trees), else None.
        swa_live_len: how far back (tokens) live SWA data reaches before ``prefix_len``.
        mamba_slot: the tree's state slot at the boundary (MAMBA trees, non-empty match),
            else None. The tree owns it: read it, never write or free it; a request takes its
            own copy with ``UnifiedCache.hybrid.copy_state(last_node)`` (copy-on-write, explicit).
        external_hit_len: tokens restorable from the store beyond ``prefix_len`` (with a
            linker attached and a ``req_id``), agreed across ranks.
    """

    device_indices: torch.Tensor
    prefix_len: int
    last_node: Any = None
    node_offset: int = 0
    swa_indices: torch.Tensor | None = None
    swa_live_len: int = 0
    mamba_slot: int | None = None
    external_hit_len: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class EvictParams:
    """Ask for ``num_tokens`` (full pool), ``swa_num_tokens`` and ``mamba_num`` to be freed."""

    num_tokens: int = 0
    swa_num_tokens: int = 0
    mamba_num: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class EvictResult:
    """What eviction freed, per pool (tokens for KV/SWA, states for MAMBA)."""

    num_tokens_evicted: int = 0
    swa_num_tokens_evicted: int = 0
    mamba_num_evicted: int = 0
