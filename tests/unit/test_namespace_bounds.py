"""Namespaces that callers control (issue #24, items 5 and 12): large distinct salts do not
pin memory in the seed memo, and the layering separator cannot appear inside a salt."""

from __future__ import annotations

import pytest

from radixlink.config import CacheConfig
from radixlink.hashing import (
    Namespace,
    layer_namespaces,
    namespace_id,
    namespace_memo_info,
    page_hashes,
)


def test_large_distinct_salts_leave_a_bounded_memo() -> None:
    """1,100 distinct 256 KiB salts (as vLLM takes them from requests) leave the seed memo
    holding at most 1 MiB of namespace text; small namespaces are still memoised."""
    for i in range(1100):
        ns = Namespace(model="m", cache_salt=f"{i:06d}" + "x" * (256 << 10))
        page_hashes([1, 2, 3, 4], 4, ns)
        namespace_id(ns)
    info = namespace_memo_info()
    assert info["chars"] <= 1 << 20, info
    small = Namespace(model="m", cache_salt="tenant-7")
    first = page_hashes([1, 2, 3, 4], 4, small)
    assert namespace_memo_info()["entries"] >= 1
    assert page_hashes([1, 2, 3, 4], 4, small) == first


def test_many_small_salts_are_bounded_by_entries() -> None:
    """Distinct small salts evict the oldest: the memo keeps at most 1,024 entries."""
    for i in range(3000):
        namespace_id(Namespace(model="m", cache_salt=str(i)))
    assert namespace_memo_info()["entries"] <= 1024


@pytest.mark.parametrize("field", ["cache_salt", "extra_key"])
def test_separator_inside_a_request_salt_is_refused(field: str) -> None:
    """A request salt holding \\x1f is a ValueError: ("a", "b\\x1fc") would otherwise equal
    ("a\\x1fb", "c")."""
    base = Namespace(model="m", **{field: "a"})
    with pytest.raises(ValueError, match="separator"):
        layer_namespaces(base, Namespace(**{field: "b\x1fc"}))
    with pytest.raises(ValueError, match="separator"):
        layer_namespaces(None, Namespace(**{field: "a\x1fb"}))
    layered = layer_namespaces(base, Namespace(**{field: "b"}))
    assert layered is not None and getattr(layered, field) == "a\x1fb"
    assert layer_namespaces(base, layered) == layered, "layering again changes nothing"


def test_separator_inside_a_cache_namespace_is_refused() -> None:
    """CacheConfig.namespace fields may not hold \\x1f."""
    with pytest.raises(ValueError, match="separator"):
        CacheConfig(page_size=4, num_tokens=64, namespace=Namespace(model="m", cache_salt="a\x1fb"))
