"""Ranks agreement as a tested property (issue #44): the ranks fuzz (``faults/ranks_fuzz.py``)
over 2, 3 and 4 simulated ranks x full / swa / mamba caches x every write policy, each rank on
its own faulty store over one shared store that loses one rank's pages at random steps.

Each run checks that the collectives pair (the same (kind, size) sequence on every rank), that
every rank serves the same prefix for every request, that every served prefix and tree page is
the whole-prefix oracle's, and exact accounting after every step and at the end.

``make test`` runs the deterministic slice below (one seed per configuration, 60 steps each);
``make soak`` runs ``test_ranks_fuzz_soak`` for ``RADIXLINK_RANKS_FUZZ_S`` seconds (fresh seeds,
200 steps per run, every configuration in turn).
"""

from __future__ import annotations

import os
import time

import pytest

from faults.ranks_fuzz import KINDS, POLICIES, Config, Summary, run

WORLD_SIZES = (2, 3, 4)
SLICE_STEPS = 100
SLICE = [Config(world_size, kind, policy, seed=100 * world_size + 10 * k + p,
                steps=SLICE_STEPS)
         for world_size in WORLD_SIZES
         for k, kind in enumerate(KINDS)
         for p, policy in enumerate(POLICIES)]


def _check_covered(cfg: Config, summary: Summary) -> None:
    """The run did what it was built for: every step ran on every rank, requests were served
    and the ranks met in collectives."""
    assert summary.steps == cfg.steps + 1, summary  # the script's first op sets the faults
    assert summary.requests > 0 and summary.collectives > 0, summary


@pytest.mark.parametrize("cfg", SLICE, ids=lambda c: f"{c.world_size}ranks-{c.kind}-{c.policy}")
def test_ranks_agree_under_faults(cfg: Config) -> None:
    """One configuration of the slice: the ranks agree on every collective and every served
    prefix, serve only the oracle's data and leak nothing (``ranks_fuzz.run`` raises on the
    first violation)."""
    _check_covered(cfg, run(cfg))


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("RADIXLINK_RANKS_FUZZ_S"),
                    reason="the long ranks fuzz runs in `make soak` (RADIXLINK_RANKS_FUZZ_S)")
def test_ranks_fuzz_soak() -> None:
    """The long run: fresh seeds over every configuration in turn until the time is up."""
    budget = float(os.environ["RADIXLINK_RANKS_FUZZ_S"])
    base = int(os.environ.get("RADIXLINK_RANKS_FUZZ_SEED", time.time_ns() % 1_000_000))
    configs = [(w, k, p) for w in WORLD_SIZES for k in KINDS for p in POLICIES]
    end, runs, steps, loads = time.monotonic() + budget, 0, 0, [0, 0]
    while time.monotonic() < end or runs < len(configs):
        world_size, kind, policy = configs[runs % len(configs)]
        cfg = Config(world_size, kind, policy, seed=base + runs, steps=200)
        summary = run(cfg)
        _check_covered(cfg, summary)
        runs, steps = runs + 1, steps + cfg.steps
        loads[0] += summary.loads_ok
        loads[1] += summary.loads_failed
    print(f"ranks fuzz soak: seeds {base}..{base + runs - 1}, {runs} runs "
          f"({runs / len(configs):.1f} per ranks x kind x policy), {steps} steps per rank, "
          f"loads ok {loads[0]} / failed {loads[1]}")
