"""Runs the Mooncake tests (tests/stores/mooncake/) against a real ``mooncake_master`` inside a
private network namespace with only loopback up, so the client's transfer listeners (which
bind all addresses) are reachable from this machine only.

Skips, with the reason, only where the Mooncake wheel or the namespace cannot be had.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mooncake_cluster import NETNS_ENV, master_binary

SUITE = Path(__file__).with_name("mooncake")
REPO_ROOT = Path(__file__).resolve().parents[2]
GLOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")


def _skip_reason() -> str | None:
    probe = subprocess.run([sys.executable, "-c", "import mooncake.store"], capture_output=True,
                           text=True, timeout=60)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return (f"Mooncake client unavailable ({last}): pip install 'radixlink[mooncake]' "
                "and apt-get install libibverbs1")
    if master_binary() is None:
        return "mooncake_master not found next to this Python or on PATH"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare (util-linux) or ip (iproute2) missing: no private network namespace"
    netns = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"],
                           capture_output=True, text=True, timeout=30)
    if netns.returncode != 0:
        return f"cannot create a network namespace: {netns.stderr.strip()[:200]}"
    return None


@pytest.mark.slow
def test_mooncake_suite_in_a_private_network_namespace() -> None:
    """Every test of tests/stores/mooncake passes (none skipped) against a real master and
    segment holders started inside ``unshare -n`` with loopback only."""
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    script = 'ip link set lo up && exec "$0" -m pytest -q -p no:cacheprovider -rs "$1"'
    env = {**os.environ, NETNS_ENV: "1", "GLOG_minloglevel": "2"}
    proc = subprocess.run(["unshare", "-n", "sh", "-c", script, sys.executable, str(SUITE)],
                          capture_output=True, text=True, timeout=900, cwd=REPO_ROOT, env=env)
    # NOTE: the Mooncake client's glog lines (clients closing at exit) are noise here
    output = "\n".join(line for line in (proc.stdout + proc.stderr).splitlines()
                       if not GLOG_LINE.match(line))
    summaries = re.findall(r"^=*\s*(\d+ (?:passed|failed|error).*?)\s*=*$", output, re.M)
    assert proc.returncode == 0, output[-6000:]
    assert summaries and "passed" in summaries[-1], output[-3000:]
    assert not re.search(r"skipped|failed|error", summaries[-1]), output[-3000:]
