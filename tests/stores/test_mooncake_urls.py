"""``mooncake://`` URLs are checked at open, before any Mooncake client exists (no cluster
needed): every option parsed, every bad value a one-line ValueError naming it."""

from __future__ import annotations

import sys

import pytest

from radixlink.stores import open_store
from radixlink.stores.mooncake_options import parse_url

BASE = "mooncake://10.0.0.5:50051"


def test_defaults_and_setup_arguments() -> None:
    """Defaults: the master's own HTTP metadata server and admin port, no segment, TCP; the
    seven setup arguments and the client's environment follow from the URL."""
    options = parse_url(f"{BASE}?advertise=10.0.0.7", {})
    assert options.setup_args() == ("10.0.0.7", "http://10.0.0.5:8080/metadata", 0, 16 << 20,
                                    "tcp", "", "10.0.0.5:50051")
    assert options.admin == "10.0.0.5:9003" and options.timeout_s == 2.0
    assert options.direct_put and not parse_url(f"{BASE}?protocol=rdma", {}).direct_put
    assert options.environment() == {"MC_TCP_BIND_ADDRESS": "10.0.0.7",
                                     "MC_STORE_CLIENT_SETUP_RETRIES": "1"}


def test_every_option_is_read() -> None:
    """Percent-encoded metadata URLs, p2p, sizes, RDMA devices, budgets and the admin address."""
    url = (f"{BASE}?metadata=etcd%3A%2F%2F10.0.0.2%3A2379&segment=4GiB&buffer=32MiB"
           "&staging=128MiB&protocol=rdma&devices=mlx5_0,mlx5_1&advertise=10.0.0.7"
           "&admin=10.0.0.5:9100&setup_retries=3&timeout=0.5")
    options = parse_url(url, {})
    assert options.metadata == "etcd://10.0.0.2:2379"
    assert (options.segment_bytes, options.buffer_bytes, options.staging_bytes) == (
        4 << 30, 32 << 20, 128 << 20)
    assert (options.protocol, options.devices, options.admin) == ("rdma", "mlx5_0,mlx5_1",
                                                                  "10.0.0.5:9100")
    assert (options.setup_retries, options.timeout_s) == (3, 0.5)
    assert parse_url(f"{BASE}?metadata=p2p&advertise=h", {}).metadata == "P2PHANDSHAKE"


def test_advertise_defaults_to_the_environment_then_loopback() -> None:
    """MC_TCP_BIND_ADDRESS wins over the guess; a loopback master means 127.0.0.1."""
    assert parse_url(BASE, {"MC_TCP_BIND_ADDRESS": "10.9.9.9"}).advertise == "10.9.9.9"
    assert parse_url("mooncake://127.0.0.1:50051", {}).advertise == "127.0.0.1"


@pytest.mark.parametrize(("url", "message"), [
    ("mooncake://10.0.0.5", "master address '10.0.0.5' is invalid"),
    ("mooncake://10.0.0.5:70000", "master address"),
    (f"{BASE}?metadata=ftp%3A%2F%2Fx", "parameter metadata='ftp://x' is invalid"),
    (f"{BASE}?segment=-1", "parameter segment='-1' is invalid"),
    (f"{BASE}?buffer=1KiB", "parameter buffer='1KiB' is invalid"),
    (f"{BASE}?protocol=efa", "expected tcp or rdma"),
    (f"{BASE}?devices=mlx5_0", "needs protocol=rdma"),
    (f"{BASE}?protocol=rdma&direct_put=true", "direct_put=true needs protocol=tcp"),
    (f"{BASE}?direct_put=maybe", "parameter direct_put='maybe' is invalid"),
    (f"{BASE}?timeout=0", "parameter timeout='0' is invalid"),
    (f"{BASE}?setup_retries=0", "parameter setup_retries='0' is invalid"),
    (f"{BASE}?admin=nohost", "parameter admin='nohost' is invalid"),
    (f"{BASE}?segmnet=1GiB", "did you mean 'segment'"),
    (f"{BASE}?auth=plain-secret", "auth must be env:VARNAME"),
])
def test_bad_urls_are_one_value_error_at_open(url: str, message: str) -> None:
    """Each bad part is a ValueError naming it, raised by open_store before any client."""
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("?", r"\?")):
        open_store(url)


def test_missing_client_names_the_extra_and_libibverbs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an importable Mooncake client (the extra or libibverbs1 missing), opening a
    valid URL raises ImportError naming both fixes."""
    monkeypatch.setitem(sys.modules, "mooncake", None)
    monkeypatch.setitem(sys.modules, "mooncake.store", None)
    with pytest.raises(ImportError, match=r"radixlink\[mooncake\].*libibverbs1"):
        open_store("mooncake://127.0.0.1:50051")
