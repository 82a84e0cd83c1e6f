"""Pure functions: per-pool page presence + hit policy -> restorable prefix lengths.

Owns the one rule every store and linker path uses (a trailing pool's window through
``components.window.trailing_restorable``, the window rule's one home). Must not touch
stores, the tree or ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import and_

from radixlink.components.window import trailing_restorable
from radixlink.contract import PoolHitPolicy, PoolName, PoolTransfer, PoolTransferResult


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolPresence:
    """What a store holds of one pool for the device-uncached tail of one request.

    Pages are counted from the first device-uncached page (page 0). Device-cached pages sit
    before it at -1, -2, ...::

        device-cached   |  store tail
          -2   -1       |   0    1    2    3    4
                        |       [ w = 2 ]             L = 3 (TRAILING): pages 1..2
              [   w = 3    ]                          L = 1 (TRAILING): pages -2..0
                        [ ALL_PAGES  ]                L = 3 (ALL_PAGES): pages 0..2

    Attributes:
        name: the pool.
        hit_policy: ``ALL_PAGES`` (prefix length L needs pages 0..L-1) or ``TRAILING_PAGES``
            (L needs the ``window_pages`` pages ending at L: max(0, L - w)..L-1 of the tail,
            plus whatever the window reaches back into the device-cached pages).
        present: one flag per tail page, page 0 first. Pages past its end count as absent,
            so a pool may ask about fewer pages than the request has. For MAMBA, ``present[i]``
            means "the recurrent state at the end of page i is stored".
        window_pages: TRAILING_PAGES only: the window w in pages (SWA: ceil(W / page_size);
            MAMBA: 1). Must be 0 for ALL_PAGES.
        live_pages_before: TRAILING_PAGES only: how many device-cached pages right before page
            0 hold this pool's data, when a window reaching back into them could find a gap.
            None (the default) means the pool's device data reaches back to the start of the
            sequence or at least a whole window, which a valid device match boundary always
            guarantees, so every window reaching before page 0 is satisfied there.
    """

    name: PoolName
    hit_policy: PoolHitPolicy
    present: tuple[bool, ...]
    window_pages: int = 0
    live_pages_before: int | None = None

    def __post_init__(self) -> None:
        trailing = self.hit_policy is PoolHitPolicy.TRAILING_PAGES
        if trailing and self.window_pages < 1:
            raise ValueError(
                f"pool {self.name.value}: TRAILING_PAGES needs window_pages >= 1, got "
                f"{self.window_pages} (SWA: ceil(window / page_size); MAMBA: 1)"
            )
        if not trailing and self.window_pages != 0:
            raise ValueError(
                f"pool {self.name.value}: ALL_PAGES takes no window, got window_pages="
                f"{self.window_pages}; use TRAILING_PAGES for a windowed pool"
            )
        if self.live_pages_before is not None and self.live_pages_before < 0:
            raise ValueError(
                f"pool {self.name.value}: live_pages_before={self.live_pages_before} is "
                "negative; pass None when device data reaches back a whole window"
            )


def restorable_prefix_pages(num_pages: int, pools: Sequence[PoolPresence]) -> PoolTransferResult:
    """Every prefix length (in tail pages) at which all pools can restore.

    A length L in 1..num_pages is restorable iff it is legal for every pool:

    - ALL_PAGES: pages 0..L-1 are present (legal lengths are 1..first missing page).
    - TRAILING_PAGES, window w: pages max(0, L - w)..L-1 are present, and when L < w the
      window's remaining w - L pages before page 0 are on device (see
      ``PoolPresence.live_pages_before``; by default they are).

    The result is sparse with trailing pools: e.g. FULL with pages 0..5 present and MAMBA
    with pages 1 and 4 present restore at exactly {2, 5}. With no pools nothing is
    restorable (no pool takes part, so there is nothing to load). O(num_pages * num_pools).

    Args:
        num_pages: whole pages in the device-uncached tail.
        pools: the presence of each pool taking part in the lookup.

    Returns:
        The restorable lengths, ascending, as a ``PoolTransferResult``.

    Raises:
        ValueError: for a negative ``num_pages`` or a pool reporting more pages than that.
    """
    if num_pages < 0:
        raise ValueError(f"num_pages={num_pages} is negative; pass the tail's whole pages")
    if not pools:
        return PoolTransferResult(restorable_prefix_pages=[])
    legal = [True] * (num_pages + 1)
    legal[0] = False  # NOTE: length 0 restores nothing; it is never reported.
    for pool in pools:
        if len(pool.present) > num_pages:
            raise ValueError(
                f"pool {pool.name.value} reports {len(pool.present)} pages but the tail has "
                f"{num_pages}; pass presence for the device-uncached pages only"
            )
        _and_legal_lengths(legal, pool)
    return PoolTransferResult(restorable_prefix_pages=list(compress(range(len(legal)), legal)))


def _and_legal_lengths(legal: list[bool], pool: PoolPresence) -> None:
    """AND ``legal[L]`` (L = 1..len-1) with whether ``pool`` can restore length L."""
    present = pool.present
    if pool.hit_policy is PoolHitPolicy.ALL_PAGES:
        first_missing = present.index(False) if False in present else len(present)
        legal[first_missing + 1 :] = [False] * max(0, len(legal) - first_missing - 1)
        return
    whole = trailing_restorable(pool.window_pages, present, len(legal), pool.live_pages_before)
    legal[:] = map(and_, legal, whole)


def largest_common(lengths_per_rank: Sequence[Sequence[int]]) -> int:
    """The largest length every rank can restore, 0 when they share none.

    This is the hit: never the largest of any single rank (local {2, 4} and {2} give 2).

    Raises:
        ValueError: when no rank's lengths are given.
    """
    if not lengths_per_rank:
        raise ValueError("largest_common needs the lengths of at least one rank, got none")
    common = set(lengths_per_rank[0]).intersection(*lengths_per_rank[1:])
    return max(common, default=0)


def presence_from_store(
    transfers: Sequence[PoolTransfer],
    exists: Sequence[bool],
    *,
    window_pages: Mapping[PoolName, int] | None = None,
) -> list[PoolPresence]:
    """Split one flat ``exists()`` answer back into per-pool presence.

    The store was asked about ``[*transfers[0].keys, *transfers[1].keys, ...]`` in one batch;
    ``exists`` answers it flag by flag in the same order::

        exists   T T F | T F F T | T
                 KV    | SWA     | MAMBA

    Args:
        transfers: the LOOKUP transfers, in the order their keys were concatenated.
        exists: one flag per concatenated key.
        window_pages: the window in pages of every TRAILING_PAGES pool, by pool name.

    Returns:
        One ``PoolPresence`` per transfer, in order.

    Raises:
        ValueError: when ``exists`` does not answer every key, or a TRAILING_PAGES pool has no
            window.
    """
    num_keys = 0
    for transfer in transfers:
        num_keys += len(transfer.keys)
    if len(exists) != num_keys:
        raise ValueError(
            f"exists() answered {len(exists)} keys but the {len(transfers)} transfers hold "
            f"{num_keys}; ask the store about every transfer's keys, concatenated in order"
        )
    windows = window_pages or {}
    out: list[PoolPresence] = []
    start = 0
    for transfer in transfers:
        end = start + len(transfer.keys)
        window = 0
        if transfer.hit_policy is PoolHitPolicy.TRAILING_PAGES:
            if transfer.name not in windows:
                raise ValueError(
                    f"pool {transfer.name.value} is TRAILING_PAGES but window_pages has no "
                    f"entry for it (has {sorted(n.value for n in windows)}); pass its window"
                )
            window = windows[transfer.name]
        flags = tuple(map(bool, exists[start:end]))
        out.append(
            PoolPresence(
                name=transfer.name,
                hit_policy=transfer.hit_policy,
                present=flags,
                window_pages=window,
            )
        )
        start = end
    return out
