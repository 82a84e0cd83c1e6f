"""Store URLs that used to open and fail later (issue 24, item 9) are a ValueError at open,
naming the URL part and a hint; the good forms still open."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixlink.stores import open_store

BAD_URLS = [
    ("redis://127.0.0.1:6379/abc", ["path /abc", "database number", "/0"]),
    ("redis://127.0.0.1:6379/1?db=2", ["database 1", "db='2'", "keep one"]),
    ("redis://127.0.0.1:6379/0?client_name=a%20b", ["client_name=", "without spaces"]),
    ("redis://127.0.0.1:6379/0?ttl=100000000000000000000", ["ttl=", "from 1 to"]),
    ("redis://127.0.0.1:99999/0", ["port", "127.0.0.1:99999", "1 to 65535"]),
    ("redis://127.0.0.1:port/0", ["port", "1 to 65535"]),
    ("redis+cluster://127.0.0.1:7000/1", ["path /1", "database 0 only"]),
    ("file:///", ["filesystem root", "directory of its own"]),
    ("file:///tmp/a%00b", ["location", "NUL byte (%00)"]),
    ("memory://?capacity=1%00", ["parameter 'capacity'", "NUL byte (%00)"]),
    ("redis://127.0.0.1:6379/0?client_name=x%00y", ["parameter 'client_name'", "NUL byte"]),
]


@pytest.mark.parametrize(("url", "words"), BAD_URLS, ids=[url for url, _ in BAD_URLS])
def test_urls_that_would_fail_later_are_refused_at_open(url: str, words: list[str]) -> None:
    """Each URL is one ValueError at open that names the URL part (path, db, port,
    parameter) and says what to write instead."""
    if url.startswith("redis"):
        pytest.importorskip("redis")
    with pytest.raises(ValueError) as caught:
        open_store(url).close()
    message = str(caught.value)
    for word in words:
        assert word in message, (word, message)


def test_database_in_the_path_or_the_query_still_opens(redis_url: str, tmp_path: Path) -> None:
    """``/N`` or ``?db=N`` (one of them) selects that database; pages written there are not
    in database 0."""
    from radixlink.contract import PoolName
    from radixlink.stores import page_key

    base = redis_url.rsplit("/", 1)[0]
    key = page_key("aaaa", "0" * 64, PoolName.KV)
    with open_store(f"{base}/3") as by_path, open_store(f"{base}?db=3") as by_query:
        assert by_path.put({key: b"page"}) == [True]
        assert by_query.exists([key]) == [True]
    with open_store(f"{base}/0") as db0:
        assert db0.exists([key]) == [False]
