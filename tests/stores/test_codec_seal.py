"""Sealed pages (format 3): keyed BLAKE3 by default, HMAC-SHA256 only by name, the MAC named in
the header, per-namespace keys from BLAKE3 derive_key; and every forgery a miss."""

from __future__ import annotations

import hmac
import struct
from collections.abc import Callable
from pathlib import Path

import blake3
import pytest

from radixlink.contract import PoolName
from radixlink.stores import PageCodec, open_store, page_key
from radixlink.stores.codec import FORMAT_VERSION, HEADER_BYTES, TAG_BYTES
from radixlink.stores.seal import PageSecret, Sealer

PAGE = 512
SECRET = b"0123456789abcdef0123456789abcdef"
KEY_A = page_key("aaaa", "11" * 32, PoolName.KV)
KEY_A2 = page_key("aaaa", "22" * 32, PoolName.KV)
KEY_B = page_key("bbbb", "11" * 32, PoolName.KV)
PAYLOAD = bytes(range(256)) * (PAGE // 256)
_LAYOUT = struct.Struct("<4sBBBB16s16sQQQ")
_FIELDS = ("magic", "version", "kind", "flags", "mac", "fp", "key", "length", "checksum",
           "reserved")


def _fields(blob: bytes) -> dict[str, object]:
    return dict(zip(_FIELDS, _LAYOUT.unpack_from(blob), strict=True))


def _with(blob: bytes, **fields: object) -> bytes:
    values = _fields(blob) | fields
    return _LAYOUT.pack(*values.values()) + blob[HEADER_BYTES:]


def _blake3_key(namespace: str) -> bytes:
    material = struct.pack("<Q", len(SECRET)) + SECRET + namespace.encode()
    context = "radixlink 2026-12 page format v3 per-namespace MAC key"
    return blake3.blake3(material, derive_key_context=context).digest()


def test_sealed_pages_are_keyed_blake3_over_header_and_payload() -> None:
    """The default seal: version 3, MAC id 1, no checksum, and a tag that is keyed BLAKE3
    (key: derive_key of the framed secret and the namespace) of header + payload."""
    blob = PageCodec("fp", PAGE, secret=SECRET).encode(PAYLOAD, KEY_A)
    head = _fields(blob)
    assert (head["version"], head["flags"], head["mac"]) == (FORMAT_VERSION, 1, 1) == (4, 1, 1)
    assert (head["kind"], head["checksum"]) == (0, 0)
    signed = blob[: HEADER_BYTES + PAGE]
    assert blob[-TAG_BYTES:] == blake3.blake3(signed, key=_blake3_key("aaaa")).digest()
    assert len(blob) == HEADER_BYTES + PAGE + TAG_BYTES


def test_hmac_sha256_only_when_named() -> None:
    """``mac="hmac-sha256"`` (or a PageSecret naming it) seals with HMAC-SHA256 under its own
    per-namespace key, MAC id 2; it round-trips only through an HMAC codec."""
    codec = PageCodec("fp", PAGE, secret=PageSecret(SECRET, "hmac-sha256"))
    assert codec.mac == "hmac-sha256" and PageCodec("fp", PAGE, secret=SECRET).mac == "blake3"
    blob = codec.encode(PAYLOAD, KEY_A)
    assert _fields(blob)["mac"] == 2
    key = hmac.digest(SECRET, b"radixlink page mac v3 hmac-sha256\x00aaaa", "sha256")
    assert blob[-TAG_BYTES:] == hmac.digest(key, blob[:-TAG_BYTES], "sha256")
    assert bytes(codec.decode(blob, KEY_A) or b"") == PAYLOAD
    assert PageCodec("fp", PAGE, secret=SECRET, mac="hmac-sha256").encode(PAYLOAD, KEY_A) == blob


def test_unknown_or_contradictory_macs_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unknown MAC name is a ValueError listing the allowed ones, at codec construction and
    at store open; ``mac=`` without ``auth=`` and a mac contradicting the secret's too."""
    with pytest.raises(ValueError, match="'sha1'.*allowed: blake3, hmac-sha256"):
        PageCodec("fp", PAGE, secret=SECRET, mac="sha1")
    with pytest.raises(ValueError, match="contradicts"):
        PageCodec("fp", PAGE, secret=PageSecret(SECRET, "hmac-sha256"), mac="blake3")
    monkeypatch.setenv("RX_SEAL_TEST", SECRET.decode())
    with pytest.raises(ValueError, match="mac='md5' is invalid; expected one of blake3, hmac"):
        open_store("memory://?auth=env:RX_SEAL_TEST&mac=md5")
    with pytest.raises(ValueError, match="no auth="):
        open_store("memory://?mac=hmac-sha256")
    store = open_store(f"file://{tmp_path}/store?auth=env:RX_SEAL_TEST&mac=hmac-sha256")
    assert store.page_secret == SECRET and store.page_secret.mac == "hmac-sha256"  # type: ignore[union-attr]
    assert SECRET.decode() not in repr(store.page_secret)
    assert open_store("memory://?auth=env:RX_SEAL_TEST").page_secret.mac == "blake3"  # type: ignore[union-attr]


def test_tenants_sharing_a_secret_never_share_a_mac_key() -> None:
    """derive_key gives each namespace its own key, and the two MACs never share one."""
    b3, hm = Sealer(SECRET, "blake3"), Sealer(SECRET, "hmac-sha256")
    keys = {b3.key_for(KEY_A), b3.key_for(KEY_B), hm.key_for(KEY_A), hm.key_for(KEY_B)}
    assert len(keys) == 4 and b3.key_for(KEY_A) == b3.key_for(KEY_A2) == _blake3_key("aaaa")
    assert Sealer(b"x" + SECRET[1:], "blake3").key_for(KEY_A) != b3.key_for(KEY_A)


def _sealed(key: str = KEY_A, secret: bytes = SECRET, mac: str = "blake3") -> bytes:
    return PageCodec("fp", PAGE, secret=secret, mac=mac).encode(PAYLOAD, key)


def _forged_marked_sealed() -> bytes:
    """A writer without the secret: right key digest, marked sealed (blake3), real tag copied."""
    evil = PageCodec("fp", PAGE).encode(b"\x7f" * PAGE, KEY_A)
    return _with(evil, flags=1, mac=1, kind=0, checksum=0) + _sealed()[-TAG_BYTES:]


def _replayed_with_rewritten_digest(source: str) -> bytes:
    """A page sealed for ``source``, its key digest rewritten to KEY_A's."""
    return _with(_sealed(source), key=_fields(_sealed())["key"])


def _as_version(version: int) -> bytes:
    return _with(_sealed(), version=version)


FORGERIES: dict[str, tuple[str, Callable[[], bytes]]] = {
    "unsealed page": ("auth", lambda: PageCodec("fp", PAGE).encode(PAYLOAD, KEY_A)),
    "copied tag": ("auth", _forged_marked_sealed),
    "tag under another secret": ("auth", lambda: _sealed(secret=b"y" * 32)),
    "replay under another key": ("key", lambda: _sealed(KEY_A2)),
    "replay, digest rewritten": ("auth", lambda: _replayed_with_rewritten_digest(KEY_A2)),
    "replay from another tenant": ("auth", lambda: _replayed_with_rewritten_digest(KEY_B)),
    "truncated tag": ("truncated", lambda: _sealed()[:-1]),
    "tag cut off": ("truncated", lambda: _sealed()[:-TAG_BYTES]),
    "extended tag": ("length", lambda: _sealed() + b"\x00"),
    "flipped tag bit": ("auth", lambda: _sealed()[:-1] + bytes([_sealed()[-1] ^ 1])),
    "payload bit rot": ("auth", lambda: _sealed()[:100] + b"!" + _sealed()[101:]),
    "version downgrade to 2": ("version", lambda: _as_version(2)),
    "version downgrade to 1": ("version", lambda: _as_version(1)),
    "mac downgrade: an HMAC page": ("auth", lambda: _sealed(mac="hmac-sha256")),
    "mac id rewritten to HMAC": ("auth", lambda: _with(_sealed(), mac=2)),
    "mac id removed": ("version", lambda: _with(_sealed(), mac=0)),
    "unknown mac id": ("version", lambda: _with(_sealed(), mac=9)),
    "sealed flag cleared": ("version", lambda: _with(_sealed(), flags=0)),
    "checksum kind set on a sealed page": ("checksum", lambda: _with(_sealed(), kind=2)),
}


@pytest.mark.parametrize("name", FORGERIES)
def test_every_forgery_is_a_miss_of_its_reason(name: str) -> None:
    """A keyed-BLAKE3 reader counts each forged, replayed, cut or downgraded page as exactly
    one miss of its reason and never returns its payload; the genuine page still reads."""
    reason, make = FORGERIES[name]
    reader = PageCodec("fp", PAGE, secret=SECRET)
    assert reader.decode(make(), KEY_A) is None
    stats = reader.stats()
    assert stats[reason] == 1 and stats["misses"] == 1 and stats["decoded"] == 0, stats
    assert bytes(reader.decode(_sealed(), KEY_A) or b"") == PAYLOAD


def test_an_hmac_reader_refuses_blake3_pages() -> None:
    """The downgrade check is symmetric: a reader that asked for HMAC-SHA256 refuses keyed
    BLAKE3 pages (``auth``), though both hold the same secret."""
    reader = PageCodec("fp", PAGE, secret=SECRET, mac="hmac-sha256")
    assert reader.decode(_sealed(), KEY_A) is None and reader.stats()["auth"] == 1
