"""``mooncake://MASTER_HOST:PORT?metadata=...`` URL options, checked at open (docs/stores.md).

Owns the parameters of a Mooncake Store URL and what they turn into (the seven ``setup``
arguments, the client's environment, budgets, the master's admin address). Imports no Mooncake.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Any

from radixlink.stores.params import (
    AUTH,
    Param,
    boolean,
    choice,
    integer,
    number,
    read_params,
    size,
    text,
)
from radixlink.stores.registry import parse_size, split_url

DEFAULT_METADATA_PORT = 8080  # mooncake_master --http_metadata_server_port default
DEFAULT_ADMIN_PORT = 9003  # mooncake_master --metrics_port default
DEFAULT_TIMEOUT_S = 2.0
_HOST_PORT_RE = re.compile(r"^([A-Za-z0-9._-]+):(\d{1,5})/?$")
_METADATA_SCHEMES = ("http://", "https://", "etcd://", "redis://")
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _metadata(value: str) -> str:
    if value.lower() == "p2p":
        return "P2PHANDSHAKE"
    if not value.startswith(_METADATA_SCHEMES) or len(value) <= len("etcd://"):
        raise ValueError(value)
    return value


def _host_port(value: str) -> str:
    if _HOST_PORT_RE.match(value) is None or not 0 < int(value.rpartition(":")[2]) < 65536:
        raise ValueError(value)
    return value.rstrip("/")


PARAMS: dict[str, Param] = {
    "metadata": Param(_metadata, None, "p2p or a percent-encoded http://, https://, etcd:// "
                      "or redis:// URL of the metadata server"),
    "segment": Param(size(0), 0, "a size >= 0 such as 4GiB (0: pages live in other processes)"),
    "buffer": Param(size(1 << 20), parse_size("16MiB"), "a size >= 1MiB such as 16MiB"),
    "staging": Param(size(1 << 20), parse_size("64MiB"), "a size >= 1MiB such as 64MiB"),
    "protocol": Param(choice("tcp", "rdma"), "tcp", "tcp or rdma"),
    "devices": Param(text, "", "RDMA device names, comma-separated (e.g. mlx5_0,mlx5_1)"),
    "advertise": Param(text, None, "this host's address the cluster reaches it at"),
    "admin": Param(_host_port, None, "HOST:PORT of the master's HTTP admin server "
                   "(--metrics_port)"),
    "direct_put": Param(boolean, None, "true or false (true needs protocol=tcp)"),
    "setup_retries": Param(integer(1, 100), 1, "an int from 1 to 100"),
    "timeout": Param(number(0, 300, low_open=True), DEFAULT_TIMEOUT_S,
                     "seconds, > 0 and at most 300"),
    "auth": AUTH,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class MooncakeOptions:
    """Everything a ``mooncake://`` URL says, checked.

    Attributes:
        master: ``HOST:PORT`` of the master's RPC service.
        metadata: the metadata server as ``setup`` takes it (``P2PHANDSHAKE`` for ``p2p``).
        segment_bytes: memory this process lends the cluster (0: it only reads and writes).
        buffer_bytes: the client's own transfer buffer.
        staging_bytes: the registered staging pages move through (a batch is split to fit).
        protocol: ``tcp`` or ``rdma``; devices: RDMA device names.
        advertise: the address this client listens at (``MC_TCP_BIND_ADDRESS``).
        admin: ``HOST:PORT`` of the master's HTTP admin server (scan, clear, stats).
        direct_put: send pages from the caller's buffers (TCP reads any address) instead of
            copying them into the registered staging first (RDMA needs registered memory).
        setup_retries: connection attempts at open (each about 4.4 s when no master answers).
        timeout_s: the longest one store call may take before it is a ``StoreError``.
        secret: the page secret (``auth=``), or None.
    """

    master: str
    metadata: str
    segment_bytes: int
    buffer_bytes: int
    staging_bytes: int
    protocol: str
    devices: str
    advertise: str
    admin: str
    direct_put: bool
    setup_retries: int
    timeout_s: float
    secret: bytes | None

    def setup_args(self) -> tuple[Any, ...]:
        """The seven positional arguments of ``MooncakeDistributedStore.setup``."""
        return (self.advertise, self.metadata, self.segment_bytes, self.buffer_bytes,
                self.protocol, self.devices, self.master)

    def environment(self) -> dict[str, str]:
        """The client's environment variables these options set."""
        return {"MC_TCP_BIND_ADDRESS": self.advertise,
                "MC_STORE_CLIENT_SETUP_RETRIES": str(self.setup_retries)}


def _route_address(host: str) -> str:
    """The local address this host reaches ``host`` from (a UDP connect sends nothing)."""
    if host in _LOOPBACK:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((host, 9))
        except OSError as exc:
            raise ValueError(f"mooncake:// store URL: cannot find this host's address towards "
                             f"{host} ({exc.strerror or exc}); set advertise=<address>") from None
        return str(sock.getsockname()[0])


def parse_url(url: str, environ: dict[str, str]) -> MooncakeOptions:
    """Check every part of a ``mooncake://`` URL.

    Args:
        url: the store URL.
        environ: the process environment (``MC_TCP_BIND_ADDRESS`` is the default ``advertise``).

    Raises:
        ValueError: a malformed master address or parameter (the message names it).
    """
    scheme, rest, params = split_url(url)
    try:
        master = _host_port(rest)
    except ValueError:
        raise ValueError(f"mooncake:// store URL: master address {rest!r} is invalid; expected "
                         "HOST:PORT of mooncake_master's RPC service, e.g. "
                         "mooncake://10.0.0.5:50051?metadata=p2p") from None
    options = read_params(scheme, params, PARAMS)
    host = master.rpartition(":")[0]
    if options["protocol"] == "tcp" and options["devices"]:
        raise ValueError(f"mooncake:// store URL: devices={options['devices']!r} needs "
                         "protocol=rdma")
    direct_put = options["direct_put"]
    if direct_put and options["protocol"] != "tcp":
        raise ValueError("mooncake:// store URL: direct_put=true needs protocol=tcp (RDMA "
                         "reads registered memory only); drop it")
    metadata = options["metadata"] or f"http://{host}:{DEFAULT_METADATA_PORT}/metadata"
    advertise = (options["advertise"] or environ.get("MC_TCP_BIND_ADDRESS")
                 or _route_address(host))
    return MooncakeOptions(
        master=master, metadata=metadata, segment_bytes=options["segment"],
        buffer_bytes=options["buffer"], staging_bytes=options["staging"],
        protocol=options["protocol"], devices=options["devices"], advertise=advertise,
        admin=options["admin"] or f"{host}:{DEFAULT_ADMIN_PORT}",
        direct_put=options["protocol"] == "tcp" if direct_put is None else direct_put,
        setup_retries=options["setup_retries"], timeout_s=options["timeout"],
        secret=options["auth"],
    )
