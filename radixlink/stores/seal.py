"""Page seals: the MAC algorithms a sealed page may name, the per-namespace MAC keys derived
from a tenant secret, and the tag over a page's header and payload (DESIGN.md section 6).

Owns the secret's checks, key derivation and tagging. Knows nothing of the page layout beyond
"the bytes to tag"; of keys it reads only the namespace field (the second ``/``-separated
part). ``codec.py`` writes the algorithm's id into every page header, so a page tagged with one
algorithm never verifies under another.
"""

from __future__ import annotations

import hmac
import struct
import threading
from collections.abc import Callable
from typing import Any

TAG_BYTES = 32
MIN_SECRET_BYTES = 16
DEFAULT_MAC = "blake3"
#: MAC name -> the id a sealed page's header carries (0: unsealed). Ids are never reused.
MAC_IDS = {"blake3": 1, "hmac-sha256": 2}
MAC_NONE = 0
# NOTE: BLAKE3 derive_key wants one hard-coded, globally unique context per use; the key
# material frames the secret by its length, so (secret, namespace) pairs never collide.
_BLAKE3_CONTEXT = "radixlink 2026-12 page format v3 per-namespace MAC key"
_HMAC_CONTEXT = b"radixlink page mac v3 hmac-sha256\x00"
_MAX_MAC_KEYS = 4096  # per-namespace MAC keys cached per sealer (tenants), then the cache resets


class PageSecret(bytes):
    """A page secret and the MAC algorithm its pages are sealed with (``auth=`` plus ``mac=``
    on a store URL). Equal to its bytes; ``mac`` travels with it to the page codecs."""

    mac: str

    def __new__(cls, secret: bytes, mac: str = DEFAULT_MAC) -> PageSecret:
        self = super().__new__(cls, secret)
        self.mac = check_mac(mac)
        return self

    def __repr__(self) -> str:  # NOTE: never the secret itself
        return f"PageSecret(<{len(self)} bytes>, mac={self.mac!r})"


def check_mac(name: object) -> str:
    """``name`` when it names a MAC algorithm pages may be sealed with.

    Raises:
        ValueError: an unknown name, with the allowed ones.
    """
    if name not in MAC_IDS:
        raise ValueError(f"unknown page MAC {name!r}; allowed: {', '.join(MAC_IDS)} "
                         f"(default {DEFAULT_MAC})")
    return name  # type: ignore[return-value]


def check_secret(secret: object) -> bytes:
    """``secret`` when it is bytes of at least ``MIN_SECRET_BYTES``.

    Raises:
        ValueError: naming the length (or the type), never the secret.
    """
    if isinstance(secret, bytes) and len(secret) >= MIN_SECRET_BYTES:
        return secret
    size = len(secret) if isinstance(secret, bytes) else type(secret).__name__
    raise ValueError(
        f"the page secret must be bytes of at least {MIN_SECRET_BYTES} bytes, got {size}; "
        "generate one with: python -c 'import secrets; print(secrets.token_hex(32))'"
    )


_SCRATCH = threading.local()  # NOTE: per verify thread, the bytes of the page it last joined


def _joined(pieces: tuple[Any, ...]) -> memoryview:
    """``pieces`` one after another in this thread's scratch buffer (kept, grown as needed):
    valid until this thread joins again."""
    views = [memoryview(piece).cast("B") for piece in pieces]
    total = sum(view.nbytes for view in views)
    scratch: memoryview | None = getattr(_SCRATCH, "buffer", None)
    if scratch is None or scratch.nbytes < total:
        scratch = _SCRATCH.buffer = memoryview(bytearray(total))
    pos = 0
    for view in views:
        scratch[pos : pos + view.nbytes] = view
        pos += view.nbytes
    return scratch[:total]


def _blake3() -> Callable[..., Any]:
    try:
        import blake3
    except ImportError:  # pragma: no cover - blake3 is a dependency; old venvs may lack it
        raise ImportError("pages sealed with mac=blake3 (the default with auth=) need the "
                          "blake3 package: pip install blake3") from None
    return blake3.blake3  # type: ignore[no-any-return]


def _namespace_field(key: str) -> str:
    """The namespace id of a ``v<N>/<namespace>/<hash>/<pool>`` key ("" for other keys)."""
    parts = key.split("/", 2)
    return parts[1] if len(parts) == 3 else ""


class Sealer:
    """Tags pages with one secret and one MAC algorithm, keyed per namespace: tenants sharing
    one secret never share a MAC key.

    ``blake3``: the MAC key of namespace ``ns`` is BLAKE3 ``derive_key`` (context
    ``_BLAKE3_CONTEXT``) of ``u64le(len(secret)) || secret || ns``; the tag is keyed BLAKE3.
    ``hmac-sha256``: the key is ``HMAC-SHA256(secret, _HMAC_CONTEXT || ns)``; the tag HMAC-SHA256.

    Thread-safe: the only state is a cache of derived keys (a dict; a lost race derives twice).
    """

    def __init__(self, secret: bytes, mac: str = DEFAULT_MAC):
        self._secret = check_secret(secret)
        self.mac = check_mac(mac)
        self.mac_id = MAC_IDS[mac]
        self._b3 = _blake3() if mac == "blake3" else None
        self._keys: dict[str, bytes] = {}

    def key_for(self, key: str) -> bytes:
        """The MAC key of store key ``key``'s namespace."""
        namespace = _namespace_field(key)
        mac_key = self._keys.get(namespace)
        if mac_key is None:
            material = namespace.encode()
            if self._b3 is not None:
                framed = struct.pack("<Q", len(self._secret)) + self._secret + material
                mac_key = self._b3(framed, derive_key_context=_BLAKE3_CONTEXT).digest()
            else:
                mac_key = hmac.digest(self._secret, _HMAC_CONTEXT + material, "sha256")
            if len(self._keys) >= _MAX_MAC_KEYS:
                self._keys.clear()  # NOTE: bounded memory with unbounded tenants
            self._keys[namespace] = mac_key
        return mac_key

    def tag(self, key: str, signed: Any, more: Any = None) -> bytes:
        """The ``TAG_BYTES`` tag of ``signed`` (then ``more``) under ``key``'s namespace key.
        Both are hashed in place (buffer protocol), never copied or joined; ``signed`` may be
        a tuple of buffers, hashed one after another (a page read scattered)."""
        mac_key = self.key_for(key)
        pieces = signed if isinstance(signed, tuple) else (signed,)
        if self._b3 is not None and len(pieces) > 1:
            # NOTE: joined first: keyed BLAKE3 updated piece by piece (a page read into 60
            # rows of 12 KiB) took 2.9x its one-shot time over the same bytes (22 SmolLM2
            # pages: 9.1 ms against 3.2); the join costs 0.6 ms of it (measured)
            pieces = (_joined(pieces),)
        if self._b3 is not None:
            h = self._b3(pieces[0], key=mac_key)
        elif more is None and len(pieces) == 1:
            return hmac.digest(mac_key, signed, "sha256")
        else:
            h = hmac.new(mac_key, pieces[0], "sha256")
        for piece in pieces[1:]:
            h.update(piece)
        if more is not None:
            h.update(more)
        return h.digest()  # type: ignore[no-any-return]

    def verify(self, key: str, signed: Any, tag: memoryview) -> bool:
        """Whether ``tag`` is the tag of ``signed`` (a buffer, or a tuple of them hashed in
        order) under ``key``'s namespace (constant time)."""
        return hmac.compare_digest(self.tag(key, signed), tag)
