"""The bytes of a page (DESIGN.md section 6): the header's layout and format version, the
checksum kinds and their functions (one buffer, pieces, or fed as read), the store-key digest,
the miss reasons, the byte view of a payload to encode (``as_bytes_view``).

Owns what a page looks like; ``codec.py`` owns encoding and verifying pages of one layout,
``seal.py`` the MAC keys and tags. Knows nothing of stores or the tree.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

try:  # NOTE: xxh3 runs at memcpy speed; crc32 is ~10x slower and would dominate a memory store.
    import xxhash

    xxh3: Callable[[Any], int] | None = xxhash.xxh3_64_intdigest
except ImportError:  # pragma: no cover - depends on the environment
    xxh3 = None

from radixlink.stores.seal import MAC_IDS

# NOTE: 4: the header is 64 bytes (8 reserved, zero), so the payload starts 64-byte aligned
# in the page: read straight into pool rows (torch aligns them to 64 bytes), a 56-byte header
# put every source byte 8 bytes behind its destination modulo 4 KiB, and the kernel's copy
# ran at 0.3-0.4x its speed (4K aliasing; measured). 3: sealed pages name their MAC (byte 7)
# and carry no checksum; 2 was HMAC-only.
FORMAT_VERSION = 4
MAGIC = b"RXLP"
CHECKSUM_NONE = 0  # sealed pages: the tag detects corruption too
CHECKSUM_CRC32 = 1
CHECKSUM_XXH3 = 2
FLAG_SEALED = 0x01  # a tag follows the payload; byte 7 names its MAC algorithm
KNOWN_MACS = frozenset(MAC_IDS.values())

# magic, format version, checksum kind, flags, MAC algorithm id, layout fingerprint digest,
# store key digest, payload length, checksum, reserved; then the payload, then the tag when
# sealed.
#
#   0     4   5   6     7    8             24            40      48        56       64
#   |magic|ver|ck |flags|mac | fingerprint | key digest  | length| checksum| reserved| payload
#   "RXLP" 4   0-2 0|1   0-2  blake2b-128   blake2b-128   u64     u64       u64: 0    <= page
#              (0: sealed)  (1 blake3, 2 hmac-sha256)           (0: sealed)         bytes
#   then, sealed: a 32-byte tag
HEADER = struct.Struct("<4sBBBB16s16sQQQ")
HEADER_BYTES = HEADER.size
# NOTE: the same layout as a numpy record, to build a batch of headers in a few array ops.
HEADER_DTYPE = np.dtype([
    ("magic", "S4"), ("version", "u1"), ("kind", "u1"), ("flags", "u1"), ("mac", "u1"),
    ("fingerprint", "V16"), ("key", "V16"), ("length", "<u8"), ("checksum", "<u8"),
    ("reserved", "<u8"),
])
assert HEADER_DTYPE.itemsize == HEADER_BYTES, "the header record and struct disagree"

SHORT = "short"  # NOTE: a whole page of a shorter payload than its pool's: not counted here
MISS_REASONS = (
    "bad_magic", "version", "fingerprint", "key", "auth", "length", "checksum", "truncated",
)  # fmt: skip


def page_checksum(kind: int, view: memoryview) -> int | None:
    if kind == CHECKSUM_XXH3:
        return xxh3(view) if xxh3 is not None else None
    if kind == CHECKSUM_CRC32:
        return zlib.crc32(view)
    return None


def page_checksum_of(kind: int, pieces: Sequence[memoryview]) -> int | None:
    """``page_checksum`` of the pieces' bytes one after another (streamed: no join)."""
    if kind == CHECKSUM_XXH3:
        if xxh3 is None:
            return None
        h = xxhash.xxh3_64()
        for piece in pieces:
            h.update(piece)
        return h.intdigest()  # type: ignore[no-any-return]
    if kind == CHECKSUM_CRC32:
        crc = 0
        for piece in pieces:
            crc = zlib.crc32(piece, crc)
        return crc
    return None


def checksum_stream(kind: int) -> Any | None:
    """A running ``page_checksum_of`` of ``kind`` fed piece by piece as a page is read
    (``update(piece)``, then ``intdigest()``), or None where there is none here (only xxh3
    has one)."""
    return xxhash.xxh3_64() if kind == CHECKSUM_XXH3 and xxh3 is not None else None


# NOTE: copying an initialised blake2b state is ~25% faster than building one with
# digest_size=16 per page; the base state is never updated, so threads may share it.
KEY_HASH = hashlib.blake2b(digest_size=16)


def key_digest(key: str) -> bytes:
    """The 16-byte digest of a store key that a page written under ``key`` carries."""
    h = KEY_HASH.copy()
    h.update(key.encode())
    return h.digest()


def row_checksum(kind: int) -> Callable[[Any], int]:
    """The one-shot checksum of ``kind`` (xxh3 or crc32) over one contiguous buffer."""
    if kind == CHECKSUM_XXH3:
        assert xxh3 is not None, "xxh3 codecs exist only with xxhash installed"
        return xxh3
    return zlib.crc32


def checksum_kind(name: str) -> tuple[str, int]:
    """The checksum ``name`` (``"auto"``: xxh3 when ``xxhash`` is installed, else crc32) and
    the kind a header names it by.

    Raises:
        ValueError: an unknown name, or xxh3 without the ``xxhash`` package.
    """
    kinds = {"xxh3": CHECKSUM_XXH3, "crc32": CHECKSUM_CRC32}
    if name == "auto":
        name = "xxh3" if xxh3 is not None else "crc32"
    if name not in kinds:
        raise ValueError(f"checksum must be 'auto', 'xxh3' or 'crc32', got {name!r}")
    if name == "xxh3" and xxh3 is None:
        raise ValueError("checksum='xxh3' needs the xxhash package: pip install xxhash")
    return name, kinds[name]


def as_bytes_view(data: Any) -> memoryview:
    """A flat byte view of ``data`` without copying (bytes-like or a CPU torch tensor): the
    payload a codec encodes.

    Raises:
        ValueError: ``data`` is neither, or a tensor off the CPU or not contiguous.
    """
    if type(data) is bytes:  # the common case, first
        return memoryview(data)
    if isinstance(data, (bytes, bytearray, memoryview)):
        view = memoryview(data)
        return view if view.format == "B" and view.ndim == 1 else view.cast("B")
    device = getattr(data, "device", None)
    if device is None or not hasattr(data, "numpy"):
        raise ValueError(f"cannot encode {type(data).__name__}: pass bytes or a CPU tensor")
    if device.type != "cpu":
        raise ValueError(f"page data is on {device}; copy it to pinned host memory first")
    if not data.is_contiguous():
        raise ValueError("page tensor is not contiguous; call .contiguous() at the boundary")
    import torch  # the stores need torch only for tensors, which the caller already imported

    return memoryview(data.reshape(-1).view(torch.uint8).numpy())
