"""The page payload format of DESIGN.md section 6: a fixed header naming the page's layout,
store key and (sealed pages) MAC algorithm, the page bytes, and (sealed pages) a tag.

Owns encoding, verification and the miss counters; ``pageformat.py`` owns the page's bytes
(header layout, checksums, key digest), ``seal.py`` the MAC keys and tags. Knows nothing of
stores or the tree.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from radixlink.stores.pageformat import (  # noqa: F401  (the format's names: re-exported)
    CHECKSUM_CRC32,
    CHECKSUM_NONE,
    CHECKSUM_XXH3,
    FLAG_SEALED,
    FORMAT_VERSION,
    HEADER,
    HEADER_BYTES,
    HEADER_DTYPE,
    KEY_HASH,
    KNOWN_MACS,
    MAGIC,
    MISS_REASONS,
    SHORT,
    as_bytes_view,
    checksum_kind,
    checksum_stream,
    key_digest,
    page_checksum,
    page_checksum_of,
    row_checksum,
)
from radixlink.stores.seal import (  # noqa: F401  (MIN_SECRET_BYTES, TAG_BYTES: re-exported)
    DEFAULT_MAC,
    MAC_IDS,
    MAC_NONE,
    MIN_SECRET_BYTES,
    TAG_BYTES,
    PageSecret,
    Sealer,
    check_mac,
)


class PageCodec:
    """Encodes one pool's pages for a store and verifies them on the way back.

    Every page names the layout it was written under (fingerprint digest) and the full store
    key it was written under (key digest): a page copied under another key, or returned for
    another key by a store that mixed up a batch, is a miss. With ``secret`` every page is
    sealed with a MAC (keyed BLAKE3 by default, keyed per namespace) over the header and
    payload, so a writer without the secret cannot produce a page this codec accepts. The
    header names the MAC algorithm and the tag covers the header, so a page of another
    algorithm (a downgrade) is a miss. Sealed pages carry no checksum: the tag detects
    corruption as well as forgery, and one pass over the payload is all a sealed page costs.

    Args:
        fingerprint: the KV layout fingerprint (dtype, layers, heads, head dim, page size,
            pool). Pages written under another fingerprint decode as misses.
        page_bytes: the layout's page size in bytes; larger payloads are rejected.
        checksum: ``"auto"`` (xxh3 when ``xxhash`` is installed, else crc32), ``"xxh3"`` or
            ``"crc32"``. Decoding accepts either kind whatever this says. A sealing codec
            writes none (its ``checksum`` reads ``"none"``): the tag covers the payload.
        secret: the page secret (at least 16 bytes), or None. A codec with a secret seals
            what it encodes and accepts only pages with a valid tag of its MAC algorithm; a
            codec without one rejects sealed pages, since it cannot verify them (both are
            ``auth`` misses). A ``PageSecret`` (a store's ``page_secret``) brings its MAC.
        mac: the MAC algorithm of sealed pages, ``"blake3"`` (keyed BLAKE3, the default) or
            ``"hmac-sha256"``; None takes the ``PageSecret``'s, else the default.

    Raises:
        ValueError: a bad ``page_bytes``, checksum name, secret or MAC name, or a ``mac``
            that contradicts the ``PageSecret``'s.

    Thread-safe: encode and decode hold no state besides counters (misses under a lock) and
    a cache of per-namespace MAC keys.
    """

    def __init__(
        self,
        fingerprint: str,
        page_bytes: int,
        checksum: str = "auto",
        *,
        secret: bytes | None = None,
        mac: str | None = None,
    ):
        if not isinstance(page_bytes, int) or page_bytes <= 0:
            raise ValueError(f"page_bytes must be a positive int, got {page_bytes!r}")
        checksum, kind = checksum_kind(checksum)
        own_mac = secret.mac if isinstance(secret, PageSecret) else None
        if mac is not None and own_mac is not None and check_mac(mac) != own_mac:
            raise ValueError(f"mac={mac!r} contradicts the page secret's mac={own_mac!r}; "
                             "give one of them")
        mac = check_mac(mac or own_mac or DEFAULT_MAC)
        # NOTE: Sealer checks the secret; its message names the length only, never the secret
        self._sealer = Sealer(secret, mac) if secret is not None else None
        self.fingerprint = fingerprint
        self.page_bytes = page_bytes
        self.checksum = checksum if self._sealer is None else "none"
        self.mac = mac if self._sealer is not None else None
        self._kind = kind if self._sealer is None else CHECKSUM_NONE
        self._fp_digest = hashlib.blake2b(fingerprint.encode(), digest_size=16).digest()
        self._flags = FLAG_SEALED if self._sealer is not None else 0
        self._mac_id = self._sealer.mac_id if self._sealer is not None else MAC_NONE
        self._tag_bytes = TAG_BYTES if self._sealer is not None else 0
        # NOTE: the constant fields of every header, so encode_frames fills only two per page
        self._template = np.zeros(1, dtype=HEADER_DTYPE)
        self._template[["magic", "version", "kind", "flags", "mac", "fingerprint", "length"]] = (
            MAGIC, FORMAT_VERSION, self._kind, self._flags, self._mac_id, self._fp_digest,
            page_bytes)
        self._lock = threading.Lock()
        self._misses: Counter[str] = Counter()
        self._num_encoded = 0
        self._num_decoded = 0

    @property
    def sealed(self) -> bool:
        """Whether this codec seals pages (it was given a secret)."""
        return self._sealer is not None

    def __repr__(self) -> str:
        return (
            f"PageCodec(fingerprint={self.fingerprint!r}, page_bytes={self.page_bytes}, "
            f"checksum={self.checksum!r}, sealed={self.sealed}, mac={self.mac!r})"
        )

    def encode(self, data: Any, key: str) -> bytes:
        """Header + payload (+ tag when sealed) as one new bytes object; the payload is copied
        exactly once.

        Args:
            data: bytes, bytearray, memoryview or a contiguous CPU torch tensor (any dtype;
                its raw bytes are stored).
            key: the store key the page is written under; ``decode`` must be given the same.

        Raises:
            ValueError: the payload is larger than ``page_bytes`` (checked before any
                allocation), ``data`` is not a CPU buffer, or ``key`` is not a string.
        """
        if not isinstance(key, str):
            raise ValueError(f"key must be the store key (str), got {type(key).__name__}")
        view = as_bytes_view(data)
        if view.nbytes > self.page_bytes:
            raise ValueError(
                f"page payload is {view.nbytes} bytes but the layout's page is "
                f"{self.page_bytes}; check the pool's page_bytes"
            )
        sealer = self._sealer
        digest = page_checksum(self._kind, view) if sealer is None else 0
        assert digest is not None, f"checksum kind {self._kind} has no implementation"
        header = HEADER.pack(
            MAGIC, FORMAT_VERSION, self._kind, self._flags, self._mac_id, self._fp_digest,
            key_digest(key), view.nbytes, digest, 0,
        )  # fmt: skip
        self._num_encoded += 1  # NOTE: no lock on the hot path; exact on GIL builds
        if sealer is None:
            return b"".join((header, view))
        return b"".join((header, view, sealer.tag(key, header, view)))

    @property
    def frame_bytes(self) -> int:
        """Bytes of one whole encoded page: header + ``page_bytes`` + the tag when sealed."""
        return HEADER_BYTES + self.page_bytes + self._tag_bytes

    def encode_into(self, frame: memoryview, key: str, length: int | None = None) -> memoryview:
        """Encode in place a page whose payload already sits at ``frame[HEADER_BYTES:]``:
        fill the header (and, sealed, the tag after the payload) and return the encoded page
        as a view of ``frame``. Copies nothing; the zero-copy twin of ``encode``.

        ::

            frame  | header (written) | payload (caller's, length bytes) | tag (written) | ...
                   0                  64                             64 + length

        Args:
            frame: a writable byte view at least ``HEADER_BYTES + length (+ TAG_BYTES)`` long.
            key: the store key the page is written under.
            length: payload bytes (default ``page_bytes``).

        Raises:
            ValueError: ``length`` over ``page_bytes``, or ``frame`` too short or read-only.
        """
        length = self.page_bytes if length is None else length
        end = HEADER_BYTES + length
        if not 0 <= length <= self.page_bytes or frame.nbytes < end + self._tag_bytes:
            raise ValueError(
                f"encode_into: a {length}-byte payload (page {self.page_bytes}) needs a frame of "
                f"{end + self._tag_bytes} bytes, got {frame.nbytes}; size it with frame_bytes"
            )
        if frame.readonly:
            raise ValueError("encode_into needs a writable frame (a bytearray or tensor view)")
        sealer = self._sealer
        digest = page_checksum(self._kind, frame[HEADER_BYTES:end]) if sealer is None else 0
        assert digest is not None, f"checksum kind {self._kind} has no implementation"
        HEADER.pack_into(
            frame, 0, MAGIC, FORMAT_VERSION, self._kind, self._flags, self._mac_id,
            self._fp_digest, key_digest(key), length, digest, 0,
        )  # fmt: skip
        self._num_encoded += 1  # NOTE: no lock on the hot path; exact on GIL builds
        if sealer is None:
            return frame[:end]
        frame[end : end + TAG_BYTES] = sealer.tag(key, frame[:end])
        return frame[: end + TAG_BYTES]

    def encode_frames(self, block: memoryview, stride: int, keys: list[str]) -> list[memoryview]:
        """``encode_into`` for many whole pages laid out at a fixed stride: frame ``i`` starts
        at ``block[i * stride]`` with its ``page_bytes`` payload in place. The offload hot
        path: per page only the key digest and checksum (sealed: tag) calls run in Python;
        the headers are built and written for the whole batch at once.

        ::

            block  | header 0 | payload 0 | tag 0? | ... | header 1 | payload 1 | ...
                   0                                     stride

        Returns:
            One read-only view of ``block`` per page: its encoded bytes.

        Raises:
            ValueError: ``block`` is read-only, or too short for ``len(keys)`` frames.
        """
        n, size, end = len(keys), self.frame_bytes, HEADER_BYTES + self.page_bytes
        if block.readonly or (n and (stride < size or block.nbytes < (n - 1) * stride + size)):
            raise ValueError(f"encode_frames needs a writable block of {n} frames of {size} "
                             f"bytes at stride {stride}, got {block.nbytes} bytes")
        if not n:
            return []
        starts = range(0, n * stride, stride)
        rows = np.ndarray((n, end), np.uint8, block, 0, (stride, 1))
        headers = np.repeat(self._template, n)
        # NOTE: the per-page work in as few Python-level calls as it takes (this is the
        # offload's cost per page): the key digests inline, the checksums over the payload
        # rows as numpy iterates them (each row a contiguous buffer, no slicing per page).
        copy, digests = KEY_HASH.copy, []
        for key in keys:
            h = copy()
            h.update(key.encode())
            digests.append(h.digest())
        headers["key"] = np.frombuffer(b"".join(digests), dtype="V16")
        sealer = self._sealer
        if sealer is None:
            headers["checksum"] = list(map(row_checksum(self._kind), rows[:, HEADER_BYTES:]))
        rows[:, :HEADER_BYTES] = headers.view(np.uint8).reshape(n, HEADER_BYTES)
        if sealer is not None:  # NOTE: the tag covers the header, so it is written after it
            tag = sealer.tag
            for i, key in zip(starts, keys):
                block[i + end : i + end + TAG_BYTES] = tag(key, block[i : i + end])
        self._num_encoded += n  # NOTE: no lock on the hot path; exact on GIL builds
        return [block[i : i + size] for i in starts]

    def count_miss(self, reason: str) -> None:
        """Count a miss found before decoding: a store value longer than any page of this
        layout (``length``), which ``Store.get_into`` reports without copying it."""
        if reason not in MISS_REASONS:
            raise ValueError(f"unknown miss reason {reason!r}; expected one of {MISS_REASONS}")
        with self._lock:
            self._misses[reason] += 1

    def decode(self, blob: bytes | bytearray | memoryview | None, key: str) -> memoryview | None:
        """The verified payload of ``blob`` as a read-only view into it, or None for a miss.

        Args:
            blob: what the store returned for ``key`` (None: the store has no such page).
            key: the store key ``blob`` was read under.

        A miss (None input excluded) is counted in ``stats()`` under one of ``bad_magic``,
        ``version``, ``fingerprint``, ``key`` (written under another key), ``auth`` (no
        valid tag, another MAC algorithm, or a sealed page and no secret), ``length``,
        ``checksum`` (unsealed pages), ``truncated``. The length field is checked against
        ``page_bytes`` before the payload is touched.
        """
        return self.verify(blob, key)[0]

    def verify(self, blob: Any, key: str) -> tuple[memoryview | None, str | None]:
        """``decode`` with the miss reason: ``(payload, None)``, or ``(None, reason)`` with a
        ``MISS_REASONS`` entry (counted) or ``"missing"`` for a None ``blob`` (not counted)."""
        if blob is None:
            return None, "missing"
        view = memoryview(blob)
        reason, length = self._check(view, key)
        if reason is not None:
            with self._lock:
                self._misses[reason] += 1
            return None, reason
        self._num_decoded += 1  # NOTE: no lock on the hot path; exact on GIL builds
        return view[HEADER_BYTES : HEADER_BYTES + length].toreadonly(), None

    @property
    def checks_xxh3(self) -> bool:
        """Whether its pages' check is an xxh3 of the payload (unsealed, ``checksum="xxh3"``):
        ``Store.get_scattered_xxh3`` can compute it as it reads."""
        return self._sealer is None and self._kind == CHECKSUM_XXH3

    def checksum_stream(self) -> Any | None:
        """A running checksum of the kind this codec writes, to feed a page's payload pieces
        as they are read (``verify_scattered``'s ``streamed``), or None: sealed pages (the
        tag is the check) or a kind with no running form (``pageformat.checksum_stream``)."""
        return checksum_stream(self._kind) if self._sealer is None else None

    def verify_scattered(self, head: memoryview, payload: Sequence[memoryview],
                         tail: memoryview, size: int | None, key: str,
                         streamed: Any | None = None) -> str | None:
        """Why a page read scattered (``Store.get_scattered``: its header into ``head``, its
        payload into the ``payload`` pieces, in order, its tag into ``tail``; ``size`` bytes
        stored) is not a whole verified page of this layout, or None. The checks are
        ``verify``'s, the checksum and tag taken over the pieces where they lie.

        ``streamed``: ``checksum_stream()`` fed every payload piece as it was read; it
        stands for the checksum over the pieces where the header names this codec's kind.

        Only a page of exactly ``frame_bytes`` is checked past its header: a shorter page's
        tag lies among the pieces (a ``short`` miss when its header is whole and names a
        shorter payload), a longer one is a ``length`` miss, as ``pageio`` reads them.
        """
        if size is None:
            return "missing"
        reason, length, kind, digest = self._check_head(head[: min(size, HEADER_BYTES)], size,
                                                        key)
        if reason is None and size > self.frame_bytes:
            reason = "length"
        if reason is None and size < self.frame_bytes:
            return SHORT  # NOTE: a whole page of a shorter payload: not a page of this pool
        if reason is None:
            sealer = self._sealer
            if streamed is not None and kind == self._kind:
                if streamed.intdigest() != digest:
                    reason = "checksum"
            elif (kind or sealer is None) and page_checksum_of(kind, payload) != digest:
                reason = "checksum"
            elif sealer is not None and not sealer.verify(key, (head, *payload), tail):
                reason = "auth"
        if reason is not None:
            with self._lock:
                self._misses[reason] += 1
            return reason
        self._num_decoded += 1  # NOTE: no lock on the hot path; exact on GIL builds
        return None

    def _check(self, view: memoryview, key: str) -> tuple[str | None, int]:
        reason, length, kind, digest = self._check_head(view[:HEADER_BYTES], view.nbytes, key)
        if reason is not None:
            return reason, 0
        end = HEADER_BYTES + length
        sealer = self._sealer
        # NOTE: a sealed page's tag covers its payload, so a checksum pass would add nothing;
        # an unsealed page without a checksum (kind 0) is a checksum miss
        if (kind or sealer is None) and page_checksum(kind, view[HEADER_BYTES:end]) != digest:
            return "checksum", 0
        # NOTE: one pass over the contiguous header + payload, no copy
        if sealer is not None and not sealer.verify(key, view[:end], view[end:]):
            return "auth", 0
        return None, length

    def _check_head(self, head: memoryview, size: int,
                    key: str) -> tuple[str | None, int, int, int]:
        """The checks of a page's header (``head``: its first bytes, at most
        ``HEADER_BYTES``) against its stored ``size``: ``(reason or None, payload length,
        checksum kind, checksum)``."""
        if head.nbytes < HEADER_BYTES:
            if not MAGIC.startswith(bytes(head[:4])):
                return "bad_magic", 0, 0, 0
            version = head.nbytes > 4 and head[4] != FORMAT_VERSION
            return ("version" if version else "truncated"), 0, 0, 0
        magic, version, kind, flags, mac, fp, kd, length, digest, reserved = (
            HEADER.unpack_from(head))
        if magic != MAGIC:
            return "bad_magic", 0, 0, 0
        if version != FORMAT_VERSION or flags & ~FLAG_SEALED or reserved or (
            (mac not in KNOWN_MACS) if flags else mac != MAC_NONE
        ):
            return "version", 0, 0, 0  # unknown bits, MAC ids or fields: a format we don't know
        if fp != self._fp_digest:
            return "fingerprint", 0, 0, 0
        if kd != key_digest(key):
            return "key", 0, 0, 0
        if flags != self._flags or mac != self._mac_id:
            # NOTE: sealed with no secret to check it, unsealed with one, another MAC
            return "auth", 0, 0, 0
        body_len = size - HEADER_BYTES - self._tag_bytes
        if length > self.page_bytes or body_len > length:
            return "length", 0, 0, 0
        if body_len < length:
            return "truncated", 0, 0, 0
        return None, length, kind, digest

    def stats(self) -> dict[str, int]:
        """Counters: ``encoded``, ``decoded`` (verified reads) and one entry per miss reason."""
        with self._lock:
            misses = dict(self._misses)
        out = {"encoded": self._num_encoded, "decoded": self._num_decoded}
        out.update({reason: misses.get(reason, 0) for reason in MISS_REASONS})
        out["misses"] = sum(out[reason] for reason in MISS_REASONS)
        return out
