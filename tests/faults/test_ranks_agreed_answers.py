"""What a linker answers its engine is the same on every tensor-parallel rank (issue #44's audit,
docs/linker.md "Ranks"): an engine may branch on it without the ranks' collectives drifting.
"""

from __future__ import annotations

from typing import Any

from faults.kit import TOKENS, make_cache, serve
from radixlink.linker.core import ExternalCacheLinker
from radixlink.linker.ranks import RankGroup, run_ranks
from radixlink.stores.faults import FaultyStore
from radixlink.stores.memory import MemoryStore


def test_flush_answers_alike_when_one_rank_is_still_writing() -> None:
    """Rank 1's puts take 0.6 s, rank 0's none: a flush with a 0.1 s timeout is False on
    both ranks (rank 0 alone was idle, but rank 1's write is not applied anywhere yet); a
    flush without a timeout is then True on both, with the offload recorded on both."""
    shared = MemoryStore(capacity_bytes=64 << 20)

    def flow(group: RankGroup) -> dict[str, Any]:
        store = FaultyStore(shared, delay_ms=600 if group.rank else 0, ops=("put",))
        cache = make_cache()
        linker = ExternalCacheLinker(cache, store, ranks=group)
        serve(cache, TOKENS)
        short = linker.flush(timeout=0.1)
        marked_early = cache.match_prefix(TOKENS).last_node.external_cache_stored
        full = linker.flush()
        marked = cache.match_prefix(TOKENS).last_node.external_cache_stored
        linker.close()
        return {"short": short, "marked_early": marked_early, "full": full, "marked": marked}

    for result in run_ranks(2, flow, timeout_s=30):
        assert result == {"short": False, "marked_early": False, "full": True,
                          "marked": True}, result
