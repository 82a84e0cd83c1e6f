"""The page codec: round trips, every miss reason counted, size checked before allocation, pages
bound to their keys, sealed pages accepted only with the right secret."""

from __future__ import annotations

import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlink.contract import PoolName
from radixlink.stores import PageCodec, page_key
from radixlink.stores.codec import HEADER_BYTES, MISS_REASONS, TAG_BYTES

PAGE = 1024
KEY = page_key("c0ffee", "ab" * 32, PoolName.KV)
OTHER_KEY = page_key("c0ffee", "cd" * 32, PoolName.KV)
SECRET = b"s" * 32
_FIELDS = ("magic", "version", "kind", "flags", "mac", "fp", "key", "length", "checksum",
           "reserved")
_LAYOUT = "<4sBBBB16s16sQQQ"


@pytest.mark.parametrize(
    "data",
    [
        b"\x01" * PAGE,
        bytearray(b"\x02" * 10),
        memoryview(b"\x03" * PAGE),
        torch.arange(PAGE, dtype=torch.uint8),
        torch.ones(4, 64, dtype=torch.float16),  # any dtype: its raw bytes are stored
    ],
    ids=["bytes", "bytearray", "memoryview", "uint8-tensor", "fp16-tensor"],
)
@pytest.mark.parametrize("secret", [None, SECRET], ids=["plain", "sealed"])
def test_round_trip_of_every_buffer_kind(data: object, secret: bytes | None) -> None:
    """encode accepts bytes-likes and CPU tensors; decode returns the same bytes."""
    codec = PageCodec("fp", PAGE, secret=secret)
    raw = data.numpy().tobytes() if isinstance(data, torch.Tensor) else bytes(data)  # type: ignore[arg-type]
    blob = codec.encode(data, KEY)
    assert len(blob) == HEADER_BYTES + len(raw) + (TAG_BYTES if secret else 0)
    assert bytes(codec.decode(blob, KEY) or b"") == raw
    assert codec.stats()["decoded"] == 1 and codec.stats()["misses"] == 0


def test_decode_is_a_view_into_the_blob() -> None:
    """decode copies nothing: the payload is a read-only view of the stored bytes."""
    blob = PageCodec("fp", PAGE).encode(b"z" * PAGE, KEY)
    view = PageCodec("fp", PAGE).decode(blob, KEY)
    assert view is not None and view.obj is blob and view.readonly


def test_oversized_payload_is_rejected_before_encoding() -> None:
    """A payload larger than the layout's page is caller misuse: ValueError naming both sizes."""
    with pytest.raises(ValueError, match="1025 bytes.*1024"):
        PageCodec("fp", PAGE).encode(b"x" * (PAGE + 1), KEY)


def test_non_contiguous_tensor_is_rejected() -> None:
    """Tensors must be contiguous at the boundary (no hidden copy)."""
    with pytest.raises(ValueError, match="contiguous"):
        PageCodec("fp", PAGE).encode(torch.zeros(8, 8, dtype=torch.uint8).t(), KEY)


def _with_header(blob: bytes, **fields: object) -> bytes:
    values = dict(zip(_FIELDS, struct.unpack_from(_LAYOUT, blob), strict=True))
    values.update(fields)
    return struct.pack(_LAYOUT, *values.values()) + blob[HEADER_BYTES:]


def _good() -> bytes:
    return PageCodec("fp", PAGE).encode(b"p" * PAGE, KEY)


@pytest.mark.parametrize(
    ("reason", "make_blob"),
    [
        ("bad_magic", lambda: b"XXXX" + _good()[4:]),
        ("bad_magic", lambda: b"nope"),
        ("version", lambda: _with_header(_good(), version=99)),
        ("version", lambda: _with_header(_good(), flags=0x80)),
        ("version", lambda: _with_header(_good(), mac=1)),  # a MAC id on an unsealed page
        ("version", lambda: _with_header(_good(), version=3)),  # the previous format
        ("version", lambda: _with_header(_good(), reserved=1)),  # a field we don't know
        ("version", lambda: b"RXLP\x01" + bytes(30)),  # a short page of format 1
        ("fingerprint", lambda: PageCodec("other-layout", PAGE).encode(b"p" * PAGE, KEY)),
        ("key", lambda: PageCodec("fp", PAGE).encode(b"p" * PAGE, OTHER_KEY)),
        ("auth", lambda: PageCodec("fp", PAGE, secret=SECRET).encode(b"p" * PAGE, KEY)),
        ("length", lambda: _with_header(_good(), length=PAGE + 1)),
        ("length", lambda: _good() + b"extra"),
        ("checksum", lambda: _good()[:-1] + b"q"),
        ("checksum", lambda: _with_header(_good(), kind=77)),
        ("truncated", lambda: _good()[:-1]),
        ("truncated", lambda: _good()[: HEADER_BYTES - 3]),
        ("truncated", lambda: b""),
    ],
)
def test_each_bad_blob_is_a_miss_counted_by_reason(reason: str, make_blob: object) -> None:
    """Every malformed blob decodes to None and increments exactly its reason's counter (a
    sealed page read without the secret is an ``auth`` miss: it cannot be verified)."""
    codec = PageCodec("fp", PAGE)
    assert codec.decode(make_blob(), KEY) is None  # type: ignore[operator]
    stats = codec.stats()
    assert stats[reason] == 1 and stats["misses"] == 1 and stats["decoded"] == 0
    assert set(MISS_REASONS) <= set(stats)


def test_a_page_read_under_another_key_is_a_key_miss() -> None:
    """A page copied under another key (same layout, valid checksum) is a ``key`` miss: the
    header's key digest names the key it was written under, whatever the store calls it."""
    codec = PageCodec("fp", PAGE)
    blob = codec.encode(b"A" * PAGE, page_key("aaaa", "11" * 32, PoolName.KV))
    for other in (page_key("bbbb", "11" * 32, PoolName.KV),  # another tenant, same hash
                  page_key("aaaa", "22" * 32, PoolName.KV),  # another page
                  page_key("aaaa", "11" * 32, PoolName.SWA),  # another pool
                  page_key("aaaa", "11" * 32, PoolName.KV, rank=1)):  # another rank
        assert codec.decode(blob, other) is None
    assert codec.stats()["key"] == 4
    assert bytes(codec.decode(blob, page_key("aaaa", "11" * 32, PoolName.KV)) or b"") == b"A" * PAGE


def test_sealed_pages_need_the_right_secret() -> None:
    """With a secret: an unsealed page, a page sealed with another secret, a tampered tag or
    payload, and a tag copied from another namespace are ``auth`` misses; the right secret
    reads the page."""
    key_a = page_key("aaaa", "11" * 32, PoolName.KV)
    key_b = page_key("bbbb", "11" * 32, PoolName.KV)
    reader = PageCodec("fp", PAGE, secret=SECRET)
    sealed = reader.encode(b"k" * PAGE, key_a)
    forged = PageCodec("fp", PAGE, secret=b"x" * 32).encode(b"k" * PAGE, key_a)
    unsealed = PageCodec("fp", PAGE).encode(b"k" * PAGE, key_a)
    bad_tag = sealed[:-1] + bytes([sealed[-1] ^ 1])
    # a writer without the secret: a correct header and key digest, marked sealed with the
    # reader's MAC (blake3, id 1), the real page's tag copied over
    payload = b"evil" * (PAGE // 4)
    evil = PageCodec("fp", PAGE).encode(payload, key_a)
    evil = _with_header(evil, flags=1, mac=1, kind=0, checksum=0) + sealed[-TAG_BYTES:]
    for blob in (forged, unsealed, bad_tag, evil):
        assert reader.decode(blob, key_a) is None
    assert reader.stats()["auth"] == 4 and reader.stats()["misses"] == 4
    # tenant b's MAC key differs from tenant a's, even with one secret for both
    sealed_b = reader.encode(b"k" * PAGE, key_b)
    assert sealed_b[-TAG_BYTES:] != sealed[-TAG_BYTES:]
    assert bytes(reader.decode(sealed, key_a) or b"") == b"k" * PAGE


@pytest.mark.parametrize("secret", [b"short", "a string secret of enough length"])
def test_a_weak_or_mistyped_secret_is_refused_without_echoing_it(secret: object) -> None:
    """A secret under 16 bytes or not bytes is a ValueError that does not contain it."""
    with pytest.raises(ValueError, match="at least 16 bytes") as info:
        PageCodec("fp", PAGE, secret=secret)  # type: ignore[arg-type]
    assert str(secret) not in str(info.value)


def test_repr_never_shows_the_secret() -> None:
    """repr names the layout and whether pages are sealed, never the secret."""
    text = repr(PageCodec("fp", PAGE, secret=SECRET))
    assert "sealed=True" in text and SECRET.decode() not in text


def test_checksum_kinds_are_interchangeable() -> None:
    """A crc32 page decodes with an xxh3 codec and vice versa (the header names the kind)."""
    crc, fast = PageCodec("fp", PAGE, checksum="crc32"), PageCodec("fp", PAGE)
    assert bytes(fast.decode(crc.encode(b"a" * 10, KEY), KEY) or b"") == b"a" * 10
    assert bytes(crc.decode(fast.encode(b"b" * 10, KEY), KEY) or b"") == b"b" * 10


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=1, max_size=PAGE), flip=st.integers(min_value=0),
       sealed=st.booleans())
def test_any_single_byte_flip_is_detected(data: bytes, flip: int, sealed: bool) -> None:
    """Round trip holds for any payload, and flipping any one byte of the blob is a miss."""
    codec = PageCodec("fp", PAGE, secret=SECRET if sealed else None)
    blob = codec.encode(data, KEY)
    assert bytes(codec.decode(blob, KEY) or b"") == data
    where = flip % len(blob)
    damaged = blob[:where] + bytes([blob[where] ^ 0x5A]) + blob[where + 1 :]
    assert codec.decode(damaged, KEY) is None


@pytest.mark.parametrize(
    ("reason", "make_blob"),
    [
        ("missing", lambda: None),
        ("key", lambda: PageCodec("fp", PAGE).encode(b"p" * PAGE, OTHER_KEY)),
        ("checksum", lambda: _good()[:-1] + b"q"),
        ("truncated", lambda: _good()[:-1]),
        (None, _good),
    ],
)
def test_verify_names_the_reason_of_a_miss(reason: str | None, make_blob: object) -> None:
    """``verify`` is ``decode`` plus the reason (a missing page is ``missing``, not counted)."""
    codec = PageCodec("fp", PAGE)
    view, why = codec.verify(make_blob(), KEY)  # type: ignore[operator]
    assert why == reason and (view is None) == (reason is not None)
    assert codec.stats()["misses"] == (0 if reason in (None, "missing") else 1)
