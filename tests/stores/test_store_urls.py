"""Store URLs are checked at open: unknown names (with a "did you mean"), types, ranges, options
that make no sense here, and file:// paths that are not a local directory are one ValueError
naming the parameter, the value and what is allowed (issue 14, item 4)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import quote

import pytest

from radixlink.stores import open_store

INNER = quote("memory://", safe="")

BAD_URLS = [
    # (url, words the message must contain)
    ("redis://127.0.0.1:6379/0?socket_timout=5",
     ["socket_timout", "did you mean", "socket_timeout"]),
    ("redis://127.0.0.1:6379/0?ssl_cert_reqs=none", ["ssl_cert_reqs", "rediss://"]),
    ("redis://127.0.0.1:6379/0?socket_timeout=-1", ["socket_timeout", "'-1'", "> 0"]),
    ("redis://127.0.0.1:6379/0?socket_timeout=abc", ["socket_timeout", "'abc'"]),
    ("redis://127.0.0.1:6379/0?decode_responses=true", ["decode_responses", "raw bytes"]),
    ("redis://127.0.0.1:6379/0?retry_on_timeout=true", ["retry_on_timeout", "retries="]),
    ("redis://127.0.0.1:6379/0?retries=-1", ["retries", "'-1'", "0 to 10"]),
    ("redis://127.0.0.1:6379/0?retries=x", ["retries", "'x'"]),
    ("redis://127.0.0.1:6379/0?ttl=abc", ["ttl", "'abc'", "from 1 to"]),
    ("redis://127.0.0.1:6379/0?ttl=0", ["ttl", "'0'"]),
    ("redis://127.0.0.1:6379/0?ttl=5&ttl=6", ["ttl", "twice"]),
    ("rediss://127.0.0.1:6379/0?ssl_ca_certs=/no/such/ca.pem", ["ssl_ca_certs", "existing"]),
    ("redis+cluster://127.0.0.1:7000?db=3", ["db", "database 0"]),
    ("memory://?capacity=lots", ["capacity", "'lots'", "2GiB"]),
    ("memory://?capacity=0", ["capacity", "'0'"]),
    ("memory://?capcity=1GiB", ["capcity", "did you mean", "'capacity'"]),
    ("file:///tmp/rx-never-created?capacity=-5", ["capacity", "'-5'"]),
    ("file:///tmp/rx-never-created?min_free=80%", ["min_free", "'80%'", "50%"]),
    ("file:///tmp/rx-never-created?max_page_bytes=1", ["max_page_bytes", "'1'"]),
    (f"faults://?inner={INNER}&fail=abc", ["fail", "'abc'", "probability"]),
    (f"faults://?inner={INNER}&fail=2", ["fail", "'2'", "0 to 1"]),
    (f"faults://?inner={INNER}&corrupt=-0.1", ["corrupt", "'-0.1'"]),
    (f"faults://?inner={INNER}&delay_ms=-5", ["delay_ms", "'-5'"]),
    (f"faults://?inner={INNER}&ops=get,explode", ["ops", "'get,explode'"]),
    (f"faults://?inner={INNER}&seed=x", ["seed", "'x'"]),
    (f"tiered://?front={INNER}&back={INNER}&queue=0", ["queue", "'0'"]),
    ("memory://?auth=plain-text-secret", ["auth", "env:VARNAME"]),
    ("memroy://", ["memroy", "did you mean memory://"]),
]


@pytest.mark.parametrize(("url", "words"), BAD_URLS, ids=[u for u, _ in BAD_URLS])
def test_bad_store_url_is_one_value_error_at_open(url: str, words: list[str]) -> None:
    """Every bad URL fails at open_store with ValueError naming the parameter, the value and
    what is allowed, before any connection or directory exists."""
    pytest.importorskip("redis")
    with pytest.raises(ValueError) as info:
        open_store(url).close()
    message = str(info.value)
    for word in words:
        assert word in message, (word, message)
    assert not os.path.exists("/tmp/rx-never-created")


def test_password_never_appears_in_url_errors() -> None:
    """A bad parameter on a URL with a password names the parameter, not the password."""
    pytest.importorskip("redis")
    with pytest.raises(ValueError) as info:
        open_store("redis://:hunter2-pw@127.0.0.1:6379/0?socket_timout=1")
    assert "hunter2-pw" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("file://localhost/tmp/rx-x", ["no host", "'localhost'", "file:///tmp/rx-x"]),
        ("file://tmp/rx-x", ["no host", "file:///tmp/rx-x"]),
        ("file:///proc/self", ["/proc"]),
        ("file:///sys/kernel", ["/sys"]),
        ("file:///dev/shm/../null", ["/dev"]),
        ("file:///dev/shm", ["/dev/shm itself", "file:///dev/shm/radixlink"]),
        ("file://", ["names no directory"]),
    ],
)
def test_file_urls_must_name_a_local_directory(url: str, words: list[str]) -> None:
    """file://host/... is refused (it used to create ./host/...); /proc, /sys and /dev are
    refused, also through a symlink."""
    cwd_entries = set(os.listdir("."))
    with pytest.raises(ValueError) as info:
        open_store(url).close()
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert set(os.listdir(".")) == cwd_entries  # nothing created relative to the cwd


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this machine")
def test_a_directory_on_the_shared_memory_tmpfs_is_a_store() -> None:
    """/dev/shm holds real files (a tmpfs): a directory of its own there is a store in RAM,
    pages round-trip; /dev/shm itself and the rest of /dev stay refused (above)."""
    root = f"/dev/shm/radixlink-test-{os.getpid()}"
    try:
        with open_store(f"file://{root}/store?capacity=1MiB") as store:
            assert store.put({"v3/ns/ab/kv": b"page"}) == [True]
            assert store.get(["v3/ns/ab/kv"]) == [b"page"]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_file_url_through_a_link_to_proc_and_onto_a_file_are_refused(tmp_path: Path) -> None:
    """A symlink into /proc is resolved before the check; a path that is a regular file is a
    clear error, not a store."""
    (tmp_path / "link").symlink_to("/proc/self")
    with pytest.raises(ValueError, match="/proc"):
        open_store(f"file://{tmp_path}/link")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        open_store(f"file://{tmp_path}/afile")


def test_good_urls_keep_working(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every documented parameter in range opens; values reach the store."""
    monkeypatch.setenv("RX_URL_TEST_SECRET", "x" * 32)
    store = open_store(f"file://{tmp_path}/s?capacity=1GiB&max_page_bytes=1MiB&min_free=1%"
                       "&auth=env:RX_URL_TEST_SECRET")
    stats = store.stats()
    assert (stats["capacity_bytes"], stats["max_page_bytes"], stats["min_free"]) == (
        1 << 30, 1 << 20, "1%")
    assert store.page_secret == b"x" * 32
    store.close()
    faulty = open_store(f"faults://?inner={INNER}&fail=0&corrupt=1&delay_ms=0&ops=get")
    assert faulty.corrupt == 1.0 and faulty.ops == {"get"} and faulty.page_secret is None
    faulty.close()
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(b"y" * 20 + b"\n")
    memory = open_store(f"memory://?capacity=1MiB&auth=file:{secret_file}")
    assert memory.page_secret == b"y" * 20
