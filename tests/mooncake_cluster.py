"""Start and stop a real Mooncake Store cluster for tests: one ``mooncake_master`` (with its
HTTP metadata and admin servers) and segment-holder processes, on free loopback ports.

Owns only process lifecycle: ports, readiness, stop/kill by PID, restart on the same ports.
Meant to run inside a private network namespace (``unshare -n``, see
tests/stores/test_mooncake.py): the Mooncake client's transfer listeners bind all addresses.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from redis_server import free_port

NETNS_ENV = "RADIXLINK_MOONCAKE_NETNS"
HOLDER = Path(__file__).with_name("mooncake_holder.py")
# NOTE: the wheel's glog writes every INFO line to stderr; keep warnings and errors
QUIET = {"GLOG_minloglevel": "1", "MC_TCP_BIND_ADDRESS": "127.0.0.1"}


def master_binary() -> str | None:
    """The wheel's ``mooncake_master`` (next to this Python first, then on PATH)."""
    local = Path(sys.executable).with_name("mooncake_master")
    return str(local) if local.exists() else shutil.which("mooncake_master")


def in_private_netns() -> bool:
    """Whether this process sees loopback only (a fresh ``unshare -n`` namespace)."""
    return [name for _, name in socket.if_nameindex()] == ["lo"] and os.environ.get(
        NETNS_ENV) == "1"


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout_s}s")


def _stop(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.kill(proc.pid, sig)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@dataclass
class MooncakeCluster:
    """A master plus segment holders of ``segment_bytes`` each, started by us."""

    workdir: Path
    segment_bytes: int = 64 << 20
    client_ttl_s: int = 2
    rpc_port: int = field(default_factory=free_port)
    metadata_port: int = field(default_factory=free_port)
    admin_port: int = field(default_factory=free_port)
    master: subprocess.Popen[bytes] | None = None
    holders: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def url(self, **params: str) -> str:
        """A client URL (no segment of its own unless ``segment=`` is passed)."""
        metadata = quote(f"http://127.0.0.1:{self.metadata_port}/metadata", safe="")
        query = {"metadata": metadata, "admin": f"127.0.0.1:{self.admin_port}",
                 "advertise": "127.0.0.1", **params}
        return f"mooncake://127.0.0.1:{self.rpc_port}?" + "&".join(
            f"{k}={v}" for k, v in query.items())

    def start(self, holders: int = 1) -> MooncakeCluster:
        self.start_master()
        for _ in range(holders):
            self.start_holder()
        return self

    def start_master(self, timeout_s: float = 15.0) -> None:
        binary = master_binary()
        assert binary is not None, "mooncake_master not found: pip install 'radixlink[mooncake]'"
        assert self.master is None or self.master.poll() is not None, "master is running"
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [binary, "--rpc_address=127.0.0.1", f"--rpc_port={self.rpc_port}",
                "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
                f"--http_metadata_server_port={self.metadata_port}",
                "--metrics_host=127.0.0.1", f"--metrics_port={self.admin_port}",
                f"--client_ttl={self.client_ttl_s}"]
        log = open(self.workdir / "master.log", "ab")  # noqa: SIM115 - the child owns it
        self.master = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                       env={**os.environ, **QUIET})
        log.close()
        for port in (self.rpc_port, self.metadata_port, self.admin_port):
            _wait_port(port, self.master, "mooncake_master", timeout_s)

    def start_holder(self, timeout_s: float = 30.0) -> subprocess.Popen[bytes]:
        """A process lending ``segment_bytes`` to the cluster; returns once it is mounted."""
        metadata = f"http://127.0.0.1:{self.metadata_port}/metadata"
        args = [sys.executable, str(HOLDER), f"127.0.0.1:{self.rpc_port}", metadata,
                str(self.segment_bytes)]
        log = open(self.workdir / f"holder{len(self.holders)}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log,
                                env={**os.environ, **QUIET})
        log.close()
        self.holders.append(proc)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        line = proc.stdout.readline() if ready else b"(nothing in time)"  # one line when set up
        if line.strip() != b"ready":
            _stop(proc, signal.SIGKILL)
            raise RuntimeError(f"segment holder failed to start: {line!r}; see "
                               f"{self.workdir}/holder*.log")
        return proc

    def kill_master(self) -> None:
        """SIGKILL the master by PID (a crash: its in-memory object table is gone)."""
        _stop(self.master, signal.SIGKILL)

    def kill_holder(self, index: int = 0) -> None:
        _stop(self.holders[index], signal.SIGKILL)

    def stop(self) -> None:
        for proc in self.holders:
            _stop(proc)
        _stop(self.master)
