"""Two real processes agree through TorchRankGroup over gloo (FileStore rendezvous in tmp_path).

The test spawns this file as a script once per rank; each rank writes its answers as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from gloo_ranks import python_command, run_gloo_ranks

_WORLD_SIZE = 2


def _rank_main(rank: int, rendezvous: str, out_path: str) -> None:
    """One rank: local restorable sets from presence maps, then every collective."""
    import torch.distributed as dist

    from radixlink.contract import PoolHitPolicy, PoolName
    from radixlink.linker import PoolPresence, TorchRankGroup, restorable_prefix_pages

    dist.init_process_group(
        "gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=_WORLD_SIZE
    )
    try:
        group = TorchRankGroup()
        # rank 0: FULL has pages 0..3, MAMBA states at pages 1, 3 -> local {2, 4}
        # rank 1: FULL has pages 0..2, MAMBA states at pages 1, 3 -> local {2}
        num_full = 4 if rank == 0 else 3
        pools = [
            PoolPresence(
                name=PoolName.KV,
                hit_policy=PoolHitPolicy.ALL_PAGES,
                present=tuple(i < num_full for i in range(4)),
            ),
            PoolPresence(
                name=PoolName.MAMBA,
                hit_policy=PoolHitPolicy.TRAILING_PAGES,
                present=(False, True, False, True),
                window_pages=1,
            ),
        ]
        local = restorable_prefix_pages(4, pools).restorable_prefix_pages
        common = group.intersect(local, 4)
        answers = {
            "rank": group.rank,
            "world_size": group.world_size,
            "device": str(group.device),
            "local": local,
            "common": common,
            "best": common[-1] if common else 0,
            "empty_on_one": group.intersect(local if rank == 0 else [], 4),
            "all_ok_one_false": group.all_ok(rank != 1),
            "all_ok_all_true": group.all_ok(True),
            "agree_count": group.agree_count(5 if rank == 0 else 3),
            "all_of": group.all_of([True, rank != 1, rank == 1]),
        }
    finally:
        dist.destroy_process_group()
    Path(out_path).write_text(json.dumps(answers))


def test_two_gloo_ranks_agree(tmp_path: Path) -> None:
    """Local {2, 4} and {2} intersect to {2} (hit 2, not 4); AND and MIN agree on both ranks."""
    answers = run_gloo_ranks(python_command(path=Path(__file__)), tmp_path,
                             world_size=_WORLD_SIZE, timeout_s=60)
    assert [a["local"] for a in answers] == [[2, 4], [2]]
    for rank, a in enumerate(answers):
        assert (a["rank"], a["world_size"], a["device"]) == (rank, 2, "cpu")
        assert a["common"] == [2] and a["best"] == 2
        assert a["empty_on_one"] == []
        assert a["all_ok_one_false"] is False and a["all_ok_all_true"] is True
        assert a["agree_count"] == 3
        assert a["all_of"] == [True, False, False]


def test_torch_rank_group_needs_init() -> None:
    """Constructing TorchRankGroup without init_process_group is a caller error."""
    import torch.distributed as dist

    from radixlink.linker import TorchRankGroup

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with pytest.raises(ValueError, match="init_process_group"):
        TorchRankGroup()


if __name__ == "__main__":
    _rank_main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
