"""Store keys and URLs: the key scheme round-trips; sizes parse; schemes resolve lazily."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest

from radixlink.contract import PoolName
from radixlink.stores import default_store_url, open_store, page_key, parse_key, parse_size
from radixlink.stores.directory import DirectoryStore
from radixlink.stores.faults import FaultyStore
from radixlink.stores.keys import KeyParts, namespace_of
from radixlink.stores.memory import MemoryStore
from radixlink.stores.registry import split_url
from radixlink.stores.tiered import TieredStore


def test_page_key_format_and_parse_round_trip() -> None:
    """Keys are <version>/<namespace>/<hash>/<pool>[/r<rank>] and parse back to their parts."""
    assert page_key("ab12", "ff00", PoolName.SWA) == "v4/ab12/ff00/swa"
    assert page_key("ab12", "ff00", "kv", rank=3) == "v4/ab12/ff00/kv/r3"
    assert page_key("", "ff00", PoolName.KV) == "v4/_/ff00/kv"
    parts = parse_key("v2/ab12/ff00/mamba/r0")
    assert parts == KeyParts(
        version=2, namespace_id="ab12", page_hash="ff00", pool=PoolName.MAMBA, rank=0
    )
    assert namespace_of("v2/ab12/ff00/kv") == "ab12"


@pytest.mark.parametrize("foreign", ["", "hello", "v1/a/b/nopool", "x1/a/b/kv", "v1/a/b/kv/3"])
def test_foreign_keys_parse_to_none(foreign: str) -> None:
    """Anything not built by page_key is reported as foreign (None), never misparsed."""
    assert parse_key(foreign) is None and namespace_of(foreign) is None


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("a/b", "ff", PoolName.KV), "without '/'"),
        (("ab", "", PoolName.KV), "non-empty"),
        (("ab", "ff", "disk"), "unknown pool"),
        (("ab", "ff", PoolName.KV, -1), "rank"),
    ],
)
def test_page_key_rejects_bad_parts(args: tuple, match: str) -> None:
    """Bad key parts are caller misuse: ValueError with the culprit."""
    with pytest.raises(ValueError, match=match):
        page_key(*args)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1024", 1024), ("2GiB", 2 << 30), ("500MB", 500 * 10**6), ("1.5k", 1536), (7, 7)],
)
def test_parse_size(text: str, expected: int) -> None:
    """Binary units are powers of 1024, decimal units powers of 1000."""
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "2 parsecs", "GiB", "-5"])
def test_parse_size_rejects_junk(text: str) -> None:
    """Unparseable sizes raise ValueError with an example."""
    with pytest.raises(ValueError, match="2GiB"):
        parse_size(text)


def test_open_store_resolves_every_local_scheme(tmp_path: Path) -> None:
    """memory, file, tiered and faults URLs open the right classes with their parameters."""
    memory = open_store("memory://?capacity=1MiB")
    assert isinstance(memory, MemoryStore) and memory.capacity_bytes == 1 << 20
    directory = open_store(f"file://{tmp_path}/d?capacity=5MB")
    assert isinstance(directory, DirectoryStore) and directory.capacity_bytes == 5 * 10**6
    inner = quote("memory://?capacity=1MiB", safe="")
    faulty = open_store(f"faults://?inner={inner}&fail=0.5&ops=get,put&seed=3")
    assert isinstance(faulty, FaultyStore) and faulty.fail == 0.5 and faulty.ops == {"get", "put"}
    back = quote(f"file://{tmp_path}/b", safe="")
    tiered = open_store(f"tiered://?front={inner}&back={back}")
    assert isinstance(tiered, TieredStore) and isinstance(tiered.back, DirectoryStore)
    for store in (memory, directory, faulty, tiered):
        store.close()


def test_unknown_scheme_and_parameter_are_value_errors() -> None:
    """An unknown scheme lists the known ones; a misspelt parameter names the allowed ones."""
    with pytest.raises(ValueError, match="known: memory, file, redis"):
        open_store("s3://bucket")
    with pytest.raises(ValueError, match="capacity"):
        open_store("memory://?capacty=1GiB")
    with pytest.raises(ValueError, match="no scheme"):
        open_store("/tmp/store")


def test_default_store_is_a_directory_under_the_user_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded default is file://~/.cache/radixlink/store, expanded per user."""
    assert default_store_url() == "file://~/.cache/radixlink/store"
    monkeypatch.setenv("HOME", str(tmp_path))
    store = open_store(default_store_url())
    assert isinstance(store, DirectoryStore)
    assert store.root == str(tmp_path / ".cache" / "radixlink" / "store")


def test_nested_urls_keep_plus_signs_and_may_skip_encoding_when_simple() -> None:
    """Query values are percent-decoded without turning '+' into a space, so a nested
    redis+cluster:// URL survives; a nested URL with one parameter needs no encoding."""
    _, _, params = split_url("tiered://?front=memory://?capacity=1MiB&back=redis+cluster://h:1")
    assert params == {"front": "memory://?capacity=1MiB", "back": "redis+cluster://h:1"}
