"""Redis credentials and TLS options pass through the store URL to the client: a linker works
against a password-protected (and a TLS-only) server; a wrong password is a clear StoreError
that never echoes the password, and through the linker it only costs cache hits."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from redis_server import RedisServer, free_port

from radixlink.errors import StoreError
from radixlink.stores import open_store

from .kit import MODEL_NS, TOKENS, assert_exact, make_cache, offload, request

pytestmark = pytest.mark.redis
PASSWORD = "pw-0f7c1e"


def _round_trip(url: str, link) -> None:
    """Cache A offloads through ``url``; cache B loads the pages byte-identical."""
    cache_a = make_cache(namespace=MODEL_NS)
    offload(cache_a, link(cache_a, url))
    cache_b = make_cache(namespace=MODEL_NS)
    result = request(cache_b, link(cache_b, url), TOKENS, "b")
    assert result["ok"] and result["prefix"] == 40, result
    assert_exact(cache_b)


def test_password_from_the_url_and_a_wrong_one(tmp_path, link) -> None:
    """redis://:pw@host:port/0 reaches a --requirepass server; with a wrong password every
    call raises StoreError saying the authentication failed (without the password), and a
    linker on it serves requests from device with its lookups and offloads counted."""
    server = RedisServer(tmp_path, extra=("--requirepass", PASSWORD)).start()
    try:
        _round_trip(f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0", link)
        wrong = f"redis://:not-{PASSWORD}x@127.0.0.1:{server.port}/0"
        store = open_store(wrong)
        with pytest.raises(StoreError, match="(?i)invalid username-password|auth") as info:
            store.exists(["k"])
        assert PASSWORD not in str(info.value) and "not-" not in str(info.value)
        store.close()
        cache = make_cache(namespace=MODEL_NS)
        linker = link(cache, wrong)
        assert request(cache, linker, TOKENS, "r")["hit"] == 0
        assert linker.flush(timeout=30)
        stats = linker.stats()
        assert stats["failures_lookup"] == 1 and stats["failures_offload"] == 1, stats
        assert_exact(cache)
    finally:
        server.stop()


def _self_signed(workdir: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not on PATH: cannot make a test certificate")
    cert, key = workdir / "cert.pem", workdir / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj",
         "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


def test_tls_options_pass_through_rediss_urls(tmp_path, link) -> None:
    """rediss://:pw@host:tls_port/0?ssl_ca_certs=CA reaches a TLS server (verified against
    our CA); a plain redis:// connection to the TLS port is a StoreError, not a hang."""
    cert, key = _self_signed(tmp_path)
    tls_port = free_port()
    extra = ("--requirepass", PASSWORD, "--tls-port", str(tls_port), "--tls-cert-file",
             str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert),
             "--tls-auth-clients", "no")
    try:
        server = RedisServer(tmp_path, extra=extra).start()
    except RuntimeError as exc:
        pytest.skip(f"this redis-server has no TLS support: {exc}")
    try:
        _round_trip(f"rediss://:{PASSWORD}@127.0.0.1:{tls_port}/0?ssl_ca_certs={cert}", link)
        plain = open_store(f"redis://:{PASSWORD}@127.0.0.1:{tls_port}/0?socket_timeout=1")
        with pytest.raises(StoreError):
            plain.exists(["k"])
        plain.close()
    finally:
        server.stop()
