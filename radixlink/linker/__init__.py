"""The external cache linker: restorable-prefix rules and rank agreement (re-exports only)."""

from radixlink.linker.ranks import (
    LocalRankGroup,
    RankGroup,
    SimulatedWorld,
    TorchRankGroup,
    run_ranks,
)
from radixlink.linker.restorable import (
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
