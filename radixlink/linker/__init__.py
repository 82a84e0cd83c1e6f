"""The external cache linker: rank agreement and the page layer's restore rule (re-exports)."""

from radixlink.linker.ranks import (
    LocalRankGroup,
    RankGroup,
    SimulatedWorld,
    TorchRankGroup,
    run_ranks,
)
from radixlink.pages.restore import (
    PoolPresence,
    largest_common,
    presence_from_store,
    restorable_prefix_pages,
)

__all__ = [
    "LocalRankGroup",
    "PoolPresence",
    "RankGroup",
    "SimulatedWorld",
    "TorchRankGroup",
    "largest_common",
    "presence_from_store",
    "restorable_prefix_pages",
    "run_ranks",
]
