"""One harness for tests with real tensor-parallel ranks: run a command once per rank in child
processes that meet through a gloo FileStore rendezvous, and collect each rank's JSON answers.

A rank's command gets ``RANK RENDEZVOUS_PATH OUT_PATH *extra`` as its last arguments and writes
its answers as JSON to ``OUT_PATH``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RANK_PROLOGUE = r"""
import datetime, json, sys
import torch.distributed as dist
from radixlink.linker import TorchRankGroup
rank, rendezvous, out, root = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method="file://" + rendezvous, rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=30))
group = TorchRankGroup()
"""
"""The start of a two-rank script run with at least one extra argument (a directory):
``rank``, ``out`` (the JSON answers' path), ``root`` and an initialised gloo ``group`` whose
collectives give up after 30 s (a rank left waiting in one fails instead of hanging)."""

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent


def run_gloo_ranks(command: Sequence[str], tmp_path: Path, *extra: str, world_size: int = 2,
                   timeout_s: float = 120) -> list[dict[str, Any]]:
    """Run ``command RANK RENDEZVOUS OUT *extra`` for every rank; each rank's JSON answers.

    Raises:
        AssertionError: a rank exited non-zero (its output tail in the message).
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(TESTS_DIR)])}
    if Path("/sys/class/net/lo").exists():
        # NOTE: pins gloo to loopback; hosts whose hostname does not resolve fail otherwise.
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    rendezvous = tmp_path / "rendezvous"
    outs = [tmp_path / f"rank{r}.json" for r in range(world_size)]
    procs = [
        subprocess.Popen([*command, str(r), str(rendezvous), str(outs[r]), *extra], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(world_size)
    ]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=timeout_s)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    for proc, log in zip(procs, logs, strict=True):
        assert proc.returncode == 0, f"rank exited {proc.returncode}:\n{log[-3000:]}"
    return [json.loads(out.read_text()) for out in outs]


def python_command(script: str | None = None, path: Path | None = None) -> list[str]:
    """The child command: ``python -c script`` or ``python path``."""
    return [sys.executable, "-c", script] if script is not None else [sys.executable, str(path)]
