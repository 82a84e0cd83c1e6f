"""The page payload format of DESIGN.md section 6: a fixed header, then the page bytes.

Owns encoding, verification and the miss counters. Knows nothing of stores, keys or the tree.
"""

from __future__ import annotations

import hashlib
import struct
import threading
import zlib
from collections import Counter
from collections.abc import Callable
from typing import Any

try:  # NOTE: xxh3 runs at memcpy speed; crc32 is ~10x slower and would dominate a memory store.
    import xxhash

    _xxh3: Callable[[Any], int] | None = xxhash.xxh3_64_intdigest
except ImportError:  # pragma: no cover - depends on the environment
    _xxh3 = None

FORMAT_VERSION = 1
MAGIC = b"RXLP"
CHECKSUM_CRC32 = 1
CHECKSUM_XXH3 = 2

# magic, format version, checksum kind, reserved, fingerprint digest, payload length, checksum
#
#   0    4   5   6     8                    24          32          40
#   |magic|ver|ck|rsvd | fingerprint (16 B) | length u64 | checksum  | payload ...
_HEADER = struct.Struct("<4sBBH16sQQ")
HEADER_BYTES = _HEADER.size

MISS_REASONS = ("bad_magic", "version", "fingerprint", "length", "checksum", "truncated")


def _checksum(kind: int, view: memoryview) -> int | None:
    if kind == CHECKSUM_XXH3:
        return _xxh3(view) if _xxh3 is not None else None
    if kind == CHECKSUM_CRC32:
        return zlib.crc32(view)
    return None


def _as_bytes_view(data: Any) -> memoryview:
    """A flat byte view of ``data`` without copying (bytes-like or a CPU torch tensor)."""
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


class PageCodec:
    """Encodes one pool's pages for a store and verifies them on the way back.

    Args:
        fingerprint: the KV layout fingerprint (dtype, layers, heads, head dim, page size,
            pool). Pages written under another fingerprint decode as misses.
        page_bytes: the layout's page size in bytes; larger payloads are rejected.
        checksum: ``"auto"`` (xxh3 when ``xxhash`` is installed, else crc32), ``"xxh3"`` or
            ``"crc32"``. Decoding accepts either kind whatever this says.

    Thread-safe: encode and decode hold no state besides counters (misses under a lock).
    """

    def __init__(self, fingerprint: str, page_bytes: int, checksum: str = "auto"):
        if not isinstance(page_bytes, int) or page_bytes <= 0:
            raise ValueError(f"page_bytes must be a positive int, got {page_bytes!r}")
        kinds = {"xxh3": CHECKSUM_XXH3, "crc32": CHECKSUM_CRC32}
        if checksum == "auto":
            checksum = "xxh3" if _xxh3 is not None else "crc32"
        if checksum not in kinds:
            raise ValueError(f"checksum must be 'auto', 'xxh3' or 'crc32', got {checksum!r}")
        if checksum == "xxh3" and _xxh3 is None:
            raise ValueError("checksum='xxh3' needs the xxhash package: pip install xxhash")
        self.fingerprint = fingerprint
        self.page_bytes = page_bytes
        self.checksum = checksum
        self._kind = kinds[checksum]
        self._fp_digest = hashlib.blake2b(fingerprint.encode(), digest_size=16).digest()
        self._lock = threading.Lock()
        self._misses: Counter[str] = Counter()
        self._num_encoded = 0
        self._num_decoded = 0

    def encode(self, data: Any) -> bytes:
        """Header + payload as one new bytes object (the payload is copied exactly once).

        Args:
            data: bytes, bytearray, memoryview or a contiguous CPU torch tensor (any dtype;
                its raw bytes are stored).

        Raises:
            ValueError: the payload is larger than ``page_bytes`` (checked before any
                allocation), or ``data`` is not a CPU buffer.
        """
        view = _as_bytes_view(data)
        if view.nbytes > self.page_bytes:
            raise ValueError(
                f"page payload is {view.nbytes} bytes but the layout's page is "
                f"{self.page_bytes}; check the pool's page_bytes"
            )
        digest = _checksum(self._kind, view)
        assert digest is not None, f"checksum kind {self._kind} has no implementation"
        header = _HEADER.pack(
            MAGIC, FORMAT_VERSION, self._kind, 0, self._fp_digest, view.nbytes, digest
        )
        self._num_encoded += 1  # NOTE: no lock on the hot path; exact on GIL builds
        return b"".join((header, view))

    def decode(self, blob: bytes | bytearray | memoryview | None) -> memoryview | None:
        """The verified payload of ``blob`` as a read-only view into it, or None for a miss.

        A miss (None input excluded) is counted in ``stats()`` under one of
        ``bad_magic``, ``version``, ``fingerprint``, ``length``, ``checksum``, ``truncated``.
        The length field is checked against ``page_bytes`` before the payload is touched.
        """
        if blob is None:
            return None
        view = memoryview(blob)
        reason = self._check(view)
        if reason is not None:
            with self._lock:
                self._misses[reason] += 1
            return None
        self._num_decoded += 1  # NOTE: no lock on the hot path; exact on GIL builds
        return view[HEADER_BYTES:].toreadonly()

    def _check(self, view: memoryview) -> str | None:
        if view.nbytes < HEADER_BYTES:
            return "truncated" if MAGIC.startswith(bytes(view[:4])) else "bad_magic"
        magic, version, kind, reserved, fp_digest, length, digest = _HEADER.unpack_from(view)
        if magic != MAGIC:
            return "bad_magic"
        if version != FORMAT_VERSION or reserved != 0:  # reserved bits: a format we don't know
            return "version"
        if fp_digest != self._fp_digest:
            return "fingerprint"
        body_len = view.nbytes - HEADER_BYTES
        if length > self.page_bytes or body_len > length:
            return "length"
        if body_len < length:
            return "truncated"
        if _checksum(kind, view[HEADER_BYTES:]) != digest:
            return "checksum"
        return None

    def stats(self) -> dict[str, int]:
        """Counters: ``encoded``, ``decoded`` (verified reads) and one entry per miss reason."""
        with self._lock:
            misses = dict(self._misses)
        out = {"encoded": self._num_encoded, "decoded": self._num_decoded}
        out.update({reason: misses.get(reason, 0) for reason in MISS_REASONS})
        out["misses"] = sum(out[reason] for reason in MISS_REASONS)
        return out
