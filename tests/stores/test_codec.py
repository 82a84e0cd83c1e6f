"""The page codec: round trips, every miss reason counted, size checked before allocation."""

from __future__ import annotations

import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlink.stores import PageCodec
from radixlink.stores.codec import HEADER_BYTES, MISS_REASONS

PAGE = 1024


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
def test_round_trip_of_every_buffer_kind(data: object) -> None:
    """encode accepts bytes-likes and CPU tensors; decode returns the same bytes."""
    codec = PageCodec("fp", PAGE)
    raw = data.numpy().tobytes() if isinstance(data, torch.Tensor) else bytes(data)  # type: ignore[arg-type]
    blob = codec.encode(data)
    assert len(blob) == HEADER_BYTES + len(raw)
    assert bytes(codec.decode(blob) or b"") == raw
    assert codec.stats()["decoded"] == 1 and codec.stats()["misses"] == 0


def test_decode_is_a_view_into_the_blob() -> None:
    """decode copies nothing: the payload is a read-only view of the stored bytes."""
    blob = PageCodec("fp", PAGE).encode(b"z" * PAGE)
    view = PageCodec("fp", PAGE).decode(blob)
    assert view is not None and view.obj is blob and view.readonly


def test_oversized_payload_is_rejected_before_encoding() -> None:
    """A payload larger than the layout's page is caller misuse: ValueError naming both sizes."""
    with pytest.raises(ValueError, match="1025 bytes.*1024"):
        PageCodec("fp", PAGE).encode(b"x" * (PAGE + 1))


def test_non_contiguous_tensor_is_rejected() -> None:
    """Tensors must be contiguous at the boundary (no hidden copy)."""
    with pytest.raises(ValueError, match="contiguous"):
        PageCodec("fp", PAGE).encode(torch.zeros(8, 8, dtype=torch.uint8).t())


def _with_header(blob: bytes, **fields: int) -> bytes:
    names = ("magic", "version", "kind", "reserved", "fp", "length", "checksum")
    values = dict(zip(names, struct.unpack_from("<4sBBH16sQQ", blob), strict=True))
    values.update(fields)
    return struct.pack("<4sBBH16sQQ", *values.values()) + blob[HEADER_BYTES:]


def _good() -> bytes:
    return PageCodec("fp", PAGE).encode(b"p" * PAGE)


@pytest.mark.parametrize(
    ("reason", "make_blob"),
    [
        ("bad_magic", lambda: b"XXXX" + _good()[4:]),
        ("bad_magic", lambda: b"nope"),
        ("version", lambda: _with_header(_good(), version=99)),
        ("fingerprint", lambda: PageCodec("other-layout", PAGE).encode(b"p" * PAGE)),
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
    """Every malformed blob decodes to None and increments exactly its reason's counter."""
    codec = PageCodec("fp", PAGE)
    assert codec.decode(make_blob()) is None  # type: ignore[operator]
    stats = codec.stats()
    assert stats[reason] == 1 and stats["misses"] == 1 and stats["decoded"] == 0
    assert set(MISS_REASONS) <= set(stats)


def test_checksum_kinds_are_interchangeable() -> None:
    """A crc32 page decodes with an xxh3 codec and vice versa (the header names the kind)."""
    crc, fast = PageCodec("fp", PAGE, checksum="crc32"), PageCodec("fp", PAGE)
    assert bytes(fast.decode(crc.encode(b"a" * 10)) or b"") == b"a" * 10
    assert bytes(crc.decode(fast.encode(b"b" * 10)) or b"") == b"b" * 10


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=1, max_size=PAGE), flip=st.integers(min_value=0))
def test_any_single_byte_flip_is_detected(data: bytes, flip: int) -> None:
    """Round trip holds for any payload, and flipping any one byte of the blob is a miss."""
    codec = PageCodec("fp", PAGE)
    blob = codec.encode(data)
    assert bytes(codec.decode(blob) or b"") == data
    where = flip % len(blob)
    damaged = blob[:where] + bytes([blob[where] ^ 0x5A]) + blob[where + 1 :]
    assert codec.decode(damaged) is None
