"""Start and stop real ``redis-server`` processes (single server or a 3-primary cluster) for tests.

Owns only process lifecycle: free loopback ports, readiness, stop/kill by PID, restart on the
same port. Never touches a server it did not start (the system one on 6379 included).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")
MISSING_REASON = "redis-server/redis-cli not on PATH (apt-get install redis-server redis-tools)"


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def cluster_free_port() -> int:
    """A free port for a cluster node: Redis also needs port + 10000 (its bus), so the port
    must be <= 55535 and its bus port free too."""
    for _ in range(200):
        port = free_port()
        if port <= 55535 and _is_free(port + 10000):
            return port
        candidate = 20000 + port % 30000  # NOTE: ephemeral ports are often above 55535
        if _is_free(candidate) and _is_free(candidate + 10000):
            return candidate
    raise RuntimeError("no free port pair (p, p + 10000) for a cluster node")


def _ping(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(64)


@dataclass
class RedisServer:
    """One ``redis-server`` we started. ``extra`` are extra command-line arguments."""

    workdir: Path
    port: int = field(default_factory=free_port)
    extra: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"redis-{self.port}.log"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        """Start (or restart, on the same port) and wait until it answers PING."""
        assert REDIS_SERVER is not None, MISSING_REASON
        assert self.proc is None or self.proc.poll() is not None, "server is already running"
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--dir", str(self.workdir)]
        args += ["--logfile", str(self.log_path), *self.extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.log_path.read_text() if self.log_path.exists() else ""
                raise RuntimeError(f"redis-server on port {self.port} exited:\n{log[-2000:]}")
            try:
                # -NOAUTH: up, with a password set
                if _ping(self.port).startswith((b"+PONG", b"-NOAUTH")):
                    return self
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer in {timeout_s}s")

    def kill(self) -> None:
        """SIGKILL by PID and reap (a crash: no shutdown, connections drop mid-reply)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()

    def cli(self, *args: str) -> str:
        """Run ``redis-cli -p PORT ARGS`` and return its stdout."""
        assert REDIS_CLI is not None, MISSING_REASON
        cmd = [REDIS_CLI, "-h", "127.0.0.1", "-p", str(self.port), *args]
        return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30).stdout


@dataclass
class RedisClusterServers:
    """Three (or more) cluster-enabled primaries joined with ``redis-cli --cluster create``."""

    servers: list[RedisServer]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.servers[0].port}"

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def start_cluster(
    workdir: Path, num_primaries: int = 3, timeout_s: float = 20.0
) -> RedisClusterServers:
    """Start ``num_primaries`` servers, create the cluster (no replicas), wait for state ok."""
    servers: list[RedisServer] = []
    try:
        for i in range(num_primaries):
            node_dir = workdir / f"node{i}"
            extra = ("--cluster-enabled", "yes", "--cluster-node-timeout", "2000")
            extra += ("--cluster-config-file", str(node_dir / "nodes.conf"))
            node = RedisServer(node_dir, extra=extra, port=cluster_free_port())
            servers.append(node.start())
        addresses = [f"127.0.0.1:{server.port}" for server in servers]
        servers[0].cli(
            "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            infos = [server.cli("cluster", "info") for server in servers]
            if all("cluster_state:ok" in info for info in infos):
                return RedisClusterServers(servers)
            time.sleep(0.05)
        raise RuntimeError(f"cluster on {addresses} not ok after {timeout_s}s")
    except BaseException:
        for server in servers:
            server.stop()
        raise
