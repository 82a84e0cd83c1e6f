"""The page codec's in-place forms (``encode_into``, ``encode_frames``): pages encoded where
their payload already sits are byte-identical to ``encode``, decode back, and bad frames are
refused with a clear error."""

from __future__ import annotations

import numpy as np
import pytest

from radixlink.contract import PoolName
from radixlink.stores import PageCodec, page_key
from radixlink.stores.codec import HEADER_BYTES, TAG_BYTES
from radixlink.stores.seal import PageSecret

PAGE = 256
SECRET = b"k" * 32
SECRETS = [None, SECRET, PageSecret(SECRET, "hmac-sha256")]


def _keys(n: int) -> list[str]:
    return [page_key("c0ffee", f"{i:064x}", PoolName.KV) for i in range(n)]


def _payloads(n: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, PAGE, dtype=np.uint8).tobytes() for _ in range(n)]


@pytest.mark.parametrize("secret", SECRETS, ids=["plain", "blake3", "hmac-sha256"])
def test_encode_frames_equals_encode_and_decodes(secret: bytes | None) -> None:
    """Frames at a spaced stride, payloads in place: the encoded views are exactly what
    encode returns for the same payload and key, and decode gives the payload back."""
    codec = PageCodec("fp", PAGE, secret=secret)
    keys, payloads = _keys(5), _payloads(5)
    stride = codec.frame_bytes + 24  # spaced, as in the linker's staging
    block = bytearray(len(keys) * stride)
    for i, payload in enumerate(payloads):
        block[i * stride + HEADER_BYTES : i * stride + HEADER_BYTES + PAGE] = payload
    views = codec.encode_frames(memoryview(block), stride, keys)
    for view, key, payload in zip(views, keys, payloads, strict=True):
        assert bytes(view) == codec.encode(payload, key)
        assert view.nbytes == HEADER_BYTES + PAGE + (TAG_BYTES if secret else 0)
        assert bytes(codec.decode(view, key) or b"") == payload
    assert codec.stats()["encoded"] == 2 * len(keys)


@pytest.mark.parametrize("secret", SECRETS, ids=["plain", "blake3", "hmac-sha256"])
def test_encode_into_writes_header_and_tag_around_the_payload(secret: bytes | None) -> None:
    """encode_into fills one frame in place (a short payload too) and returns its view."""
    codec = PageCodec("fp", PAGE, secret=secret)
    key, payload = _keys(1)[0], _payloads(1)[0][:100]
    frame = bytearray(codec.frame_bytes)
    frame[HEADER_BYTES : HEADER_BYTES + 100] = payload
    view = codec.encode_into(memoryview(frame), key, 100)
    assert bytes(view) == codec.encode(payload, key)
    assert bytes(codec.decode(view, key) or b"") == payload


def test_bad_frames_are_refused_with_the_sizes() -> None:
    """A read-only block, a block too short for its frames, a stride under a frame, a payload
    over the page: ValueError naming the sizes; an unknown miss reason is refused too."""
    codec = PageCodec("fp", PAGE)
    keys = _keys(2)
    with pytest.raises(ValueError, match="writable block of 2 frames"):
        codec.encode_frames(memoryview(bytes(2 * codec.frame_bytes)), codec.frame_bytes, keys)
    with pytest.raises(ValueError, match="writable block of 2 frames"):
        codec.encode_frames(memoryview(bytearray(codec.frame_bytes)), codec.frame_bytes, keys)
    with pytest.raises(ValueError, match="at stride 10"):
        codec.encode_frames(memoryview(bytearray(4 * codec.frame_bytes)), 10, keys)
    with pytest.raises(ValueError, match=f"{PAGE + 1}-byte payload"):
        codec.encode_into(memoryview(bytearray(2 * codec.frame_bytes)), keys[0], PAGE + 1)
    with pytest.raises(ValueError, match="writable frame"):
        codec.encode_into(memoryview(bytes(codec.frame_bytes)), keys[0])
    with pytest.raises(ValueError, match="unknown miss reason"):
        codec.count_miss("nope")
    codec.count_miss("length")
    assert codec.stats()["length"] == 1 and codec.encode_frames(memoryview(bytearray()), 1,
                                                                []) == []
