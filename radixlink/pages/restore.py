"""The restore rule: per-pool page presence + hit policy -> restorable prefix lengths, pure.

Owns the one rule every adapter applies (the tree's linker, SGLang's linker and HiCache
backend, vLLM's scheduler), the one split of a flat ``exists`` answer into per-pool presence,
the trailing-window rule (SWA's window, MAMBA's one page), and which stored pages a load
never reads (``stored_past``: a save rewrites them). Must not touch stores, the
tree, ranks or components: a pool is named by its hit policy and window (``PoolRule``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import and_

from radixlink.contract import PoolHitPolicy, PoolName, PoolTransfer, PoolTransferResult

_ALL, _TRAILING = PoolHitPolicy.ALL_PAGES, PoolHitPolicy.TRAILING_PAGES


@dataclass(frozen=True, slots=True)
class PoolRule:
    """What a restore needs of one pool: its hit policy and, for ``TRAILING_PAGES``, its
    window in pages (SWA: ``ceil(W / page_size)``; MAMBA: 1)."""

    name: PoolName
    hit_policy: PoolHitPolicy = _ALL
    window_pages: int = 0


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
        trailing = self.hit_policy is _TRAILING
        if self.window_pages < 1 if trailing else self.window_pages != 0:
            raise ValueError(
                f"pool {self.name.value}: {self.hit_policy.name} takes window_pages "
                f"{'>= 1 (SWA: ceil(window / page_size); MAMBA: 1)' if trailing else '0'}, "
                f"got {self.window_pages}"
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
    if pool.hit_policy is _ALL:
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


def split_presence(rules: Sequence[PoolRule], present: Sequence[bool],
                   sizes: Sequence[int]) -> list[PoolPresence]:
    """Split one flat ``exists()`` answer back into per-pool presence: ``sizes[i]`` flags of
    ``rules[i]``'s pages, pool after pool (the one split every adapter's lookup uses)::

        present  T T F | T F F T | T
                 KV    | SWA     | MAMBA

    Raises:
        ValueError: ``present`` does not answer every page.
    """
    if len(present) != sum(sizes):
        raise ValueError(f"exists() answered {len(present)} keys but the {len(rules)} pools "
                         f"hold {sum(sizes)}; ask about every pool's keys, pool after pool")
    out, start = [], 0
    for rule, size in zip(rules, sizes, strict=True):
        out.append(PoolPresence(name=rule.name, hit_policy=rule.hit_policy,
                                present=tuple(map(bool, present[start : start + size])),
                                window_pages=rule.window_pages))
        start += size
    return out


def restorable(rules: Sequence[PoolRule], present: Sequence[bool], num_pages: int) -> list[int]:
    """Every restorable length from one ``exists`` answer about the same ``num_pages`` tail
    pages of every pool in ``rules`` (in order)."""
    pools = split_presence(rules, present, [num_pages] * len(rules))
    return restorable_prefix_pages(num_pages, pools).restorable_prefix_pages


def stored_past(present: Sequence[bool], num_pages: int, reach: int) -> list[int]:
    """Where ``present`` (``num_pages`` flags per pool or rank, one run after another) holds a
    page at tail page ``reach`` or later: a load of ``reach`` pages never reads it, so
    nothing has verified it. The heal-in-one-pass rule: the request recomputes these pages,
    and its save rewrites them rather than skip them as stored (one may be damaged behind
    the missing page that ended the hit)."""
    if num_pages <= 0:
        return []
    return [i for start in range(0, len(present), num_pages)
            for i in range(start + reach, start + num_pages) if present[i]]


def presence_from_store(
    transfers: Sequence[PoolTransfer],
    exists: Sequence[bool],
    *,
    window_pages: Mapping[PoolName, int] | None = None,
) -> list[PoolPresence]:
    """``split_presence`` of the keys of LOOKUP ``transfers``, concatenated in order (each
    names its own pages), with the window of every TRAILING_PAGES pool by name.

    Raises:
        ValueError: a TRAILING_PAGES pool has no window, or ``exists`` does not answer every
            key.
    """
    windows = window_pages or {}
    rules = []
    for t in transfers:
        if t.hit_policy is _TRAILING and t.name not in windows:
            raise ValueError(
                f"pool {t.name.value} is TRAILING_PAGES but window_pages has no entry for it "
                f"(has {sorted(n.value for n in windows)}); pass its window"
            )
        rules.append(PoolRule(t.name, t.hit_policy,
                              windows[t.name] if t.hit_policy is _TRAILING else 0))
    return split_presence(rules, exists, [len(t.keys) for t in transfers])


def trailing_restorable(window_pages: int, present: tuple[bool, ...], num_lengths: int,
                        live_before: int | None) -> list[bool]:
    """The trailing-window rule of a restore, in pages: for each tail length ``L`` in
    ``0..num_lengths-1``, whether a window of ``window_pages`` (SWA: ``Window.pages``; MAMBA's
    state: 1) is whole at ``L``. It is when the window's last ``min(window_pages, L)`` tail
    pages are ``present`` (pages past its end are absent) and the ``window_pages - L`` pages
    it reaches back before page 0 (when ``L < window_pages``) are live on device: at most
    ``live_before`` of them (None: all). Length 0 is never whole."""
    out = [False] * num_lengths
    num_present = len(present)
    run = 0  # consecutive present pages ending at page L - 1
    for n in range(1, num_lengths):
        run = run + 1 if n <= num_present and present[n - 1] else 0
        need = min(window_pages, n)  # the tail pages the window covers (``Window.trailing``)
        out[n] = run >= need and (live_before is None or window_pages - need <= live_before)
    return out
