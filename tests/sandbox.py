"""Test support: run a child command with a directory made read-only, even as root.

Owns only the command wrapping; callers run the command and judge what it did.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def read_only_command(root: Path, cmd: list[str]) -> list[str]:
    """``cmd`` wrapped so that ``root`` is read-only while it runs: a read-only bind mount in a
    private mount namespace when we are root (root ignores modes), else chmod (the caller
    restores the modes)."""
    if os.geteuid() != 0:
        for path in [root, *root.rglob("*")]:
            if path.is_dir():
                path.chmod(0o555)
        return cmd
    if shutil.which("unshare") is None:
        pytest.skip("running as root without unshare(1): cannot make a directory read-only")
    quoted = " ".join(f"'{arg}'" for arg in cmd)
    script = f"mount --bind {root} {root} && mount -o remount,bind,ro {root} && exec {quoted}"
    return ["unshare", "-m", "sh", "-c", script]
