"""Pages verified where they lie (``PageCodec.verify_scattered``): a load reads a page's header
and tag into staging and its payload straight into pool rows; the verdict must be ``verify``'s
on the same bytes, for every reason a page can fail, unsealed and sealed."""

from __future__ import annotations

import random
import struct

import pytest

from radixlink.contract import PoolName
from radixlink.pages import pageio
from radixlink.stores import PageCodec, open_store, page_key
from radixlink.stores.codec import HEADER_BYTES, SHORT, TAG_BYTES
from radixlink.stores.memory import MemoryStore
from radixlink.stores.seal import PageSecret

PAGE = 3 * 1024
SECRET = b"0123456789abcdef0123456789abcdef"
KEY = page_key("aaaa", "11" * 32, PoolName.KV)
OTHER_KEY = page_key("aaaa", "22" * 32, PoolName.KV)
PAYLOAD = random.Random(7).randbytes(PAGE)
_LAYOUT = struct.Struct("<4sBBBB16s16sQQQ")


def _codecs() -> dict[str, PageCodec]:
    return {"xxh3": PageCodec("fp", PAGE, "xxh3"), "crc32": PageCodec("fp", PAGE, "crc32"),
            "blake3": PageCodec("fp", PAGE, secret=SECRET),
            "hmac": PageCodec("fp", PAGE, secret=PageSecret(SECRET, "hmac-sha256"))}


def _scatter(codec: PageCodec, blob: bytes, cuts: list[int]) -> tuple[
        memoryview, list[memoryview], memoryview, int]:
    """``blob`` as a scattered read lays it out: header, payload pieces cut at ``cuts``
    (payload offsets), tail; a blob of another length fills what it reaches."""
    tag = codec.frame_bytes - HEADER_BYTES - PAGE
    head, tail = memoryview(bytearray(HEADER_BYTES)), memoryview(bytearray(tag))
    bounds = [0, *cuts, PAGE]
    payload = [memoryview(bytearray(b - a)) for a, b in zip(bounds, bounds[1:])]
    pos = 0
    for piece in [head, *payload, tail]:
        take = max(0, min(piece.nbytes, len(blob) - pos))
        piece[:take] = blob[pos : pos + take]
        pos += take
    return head, payload, tail, len(blob)


def _header(blob: bytes, **fields: object) -> bytes:
    names = ("magic", "version", "kind", "flags", "mac", "fp", "key", "length", "checksum",
             "reserved")
    values = dict(zip(names, _LAYOUT.unpack_from(blob), strict=True)) | fields
    return _LAYOUT.pack(*values.values()) + blob[HEADER_BYTES:]


def _damaged(codec: PageCodec) -> dict[str, tuple[bytes, str]]:
    """Each way a stored value can be wrong, as ``(blob, the key it is read under)``."""
    good = codec.encode(PAYLOAD, KEY)
    flipped = bytearray(good)
    flipped[HEADER_BYTES + PAGE // 2] ^= 1
    short_codec = PageCodec("fp", PAGE, codec.checksum if not codec.sealed else "auto",
                            secret=SECRET if codec.sealed else None,
                            mac=codec.mac if codec.sealed else None)
    return {
        "good": (good, KEY),
        "payload bit": (bytes(flipped), KEY),
        "other key": (good, OTHER_KEY),
        "other layout": (PageCodec("fp2", PAGE, secret=SECRET if codec.sealed else None,
                                   mac=codec.mac if codec.sealed else None).encode(PAYLOAD, KEY),
                         KEY),
        "unsealed for sealed / sealed for unsealed": (
            (PageCodec("fp", PAGE) if codec.sealed else PageCodec("fp", PAGE, secret=SECRET))
            .encode(PAYLOAD, KEY), KEY),
        "truncated": (good[:-7], KEY),
        "header only, cut": (good[:30], KEY),
        "not a page": (b"hello", KEY),
        "longer": (good + b"x" * 9, KEY),
        "short payload": (short_codec.encode(PAYLOAD[:-100], KEY), KEY),
        "bad length field": (_header(good, length=PAGE + 1), KEY),
        "bad version": (_header(good, version=9), KEY),
        "reserved set": (_header(good, reserved=5), KEY),
    }


@pytest.mark.parametrize("name", sorted(_codecs()))
@pytest.mark.parametrize("cuts", [[], [1], [1000, 1001, 2048], list(range(64, PAGE, 64))],
                         ids=["one piece", "1 + rest", "uneven", "48 pieces"])
def test_verdicts_match_verify_on_the_same_bytes(name: str, cuts: list[int]) -> None:
    """Every damaged page is refused for the reason ``verify`` gives the same bytes (a
    longer value as ``pageio`` reads it: ``length``; a whole page of a shorter payload:
    ``short``), and the good one passes, however its payload is cut."""
    codec = _codecs()[name]
    for case, (blob, key) in _damaged(codec).items():
        head, payload, tail, size = _scatter(codec, blob, cuts)
        got = codec.verify_scattered(head, payload, tail, size, key)
        view, why = codec.verify(blob, key)
        if why is None and len(blob) > codec.frame_bytes:
            why = "length"  # NOTE: only the head fits in a frame: pageio's reading
        elif why is None and view is not None and view.nbytes != PAGE:
            why = SHORT
        assert got == why, (case, got, why)
        assert (got is None) == (case == "good"), case


def test_a_missing_page_and_the_miss_counters() -> None:
    """None stored bytes are ``missing`` (not counted); each counted reason is counted once."""
    codec = PageCodec("fp", PAGE)
    head, payload, tail, _ = _scatter(codec, codec.encode(PAYLOAD, KEY), [])
    assert codec.verify_scattered(head, payload, tail, None, KEY) == "missing"
    assert codec.verify_scattered(head, payload, tail, codec.frame_bytes, OTHER_KEY) == "key"
    assert codec.verify_scattered(head, payload, tail, codec.frame_bytes, KEY) is None
    stats = codec.stats()
    assert stats["key"] == 1 and stats["misses"] == 1 and stats["decoded"] == 1


def test_sealed_tail_is_checked_where_it_lies() -> None:
    """A sealed page's tag read into its own staging: a flipped tag bit is an ``auth``
    miss, a flipped header byte too (the tag covers the header)."""
    codec = PageCodec("fp", PAGE, secret=SECRET)
    head, payload, tail, size = _scatter(codec, codec.encode(PAYLOAD, KEY), [100])
    assert tail.nbytes == TAG_BYTES
    tail[3] ^= 1
    assert codec.verify_scattered(head, payload, tail, size, KEY) == "auth"
    tail[3] ^= 1
    head[48] ^= 1  # the checksum field: not read for sealed pages, but signed
    assert codec.verify_scattered(head, payload, tail, size, KEY) == "auth"


def test_scattered_read_policy_through_a_directory(tmp_path, page_loop: str) -> None:
    """``read_scattered`` against a real directory store: the good pages' payloads land in
    their pieces, a corrupt one is a counted miss deleted from the store and remembered bad,
    a missing one a plain miss. In Python each page is verified before the next is read; the
    compiled loop reads them all, each checksummed as read, and the headers are checked
    after it."""
    store = open_store(f"file://{tmp_path}/store")
    codec = PageCodec("fp", PAGE)
    keys = [page_key("aaaa", f"{i:064x}", PoolName.KV) for i in range(4)]
    payloads = [random.Random(i).randbytes(PAGE) for i in range(4)]
    store.put({k: codec.encode(p, k) for k, p in zip(keys[:3], payloads[:3])})
    blob = bytearray(store.get([keys[1]])[0])
    blob[-1] ^= 0x80
    store.put({keys[1]: bytes(blob)})
    rows = memoryview(bytearray(4 * PAGE))
    views = [(rows[i * PAGE : i * PAGE + 100], rows[i * PAGE + 100 : (i + 1) * PAGE])
             for i in range(4)]
    parts = [pageio.ScatteredPages(codec, keys, views)]
    bad = pageio.BadKeys()
    checked: list[int] = []
    streamed: list[bool] = []
    verify = codec.verify_scattered

    def watched(head, payload, tail, size, key, running=None):  # noqa: ANN001, ANN202
        checked.append(sum(bytes(rows[i * PAGE : (i + 1) * PAGE]) == payloads[i]
                           for i in range(4)))  # pages read so far
        streamed.append(running is not None)
        return verify(head, payload, tail, size, key, running)

    codec.verify_scattered = watched  # type: ignore[method-assign]
    read = pageio.read_scattered(store, parts, bad=bad)
    # NOTE: in Python page i is checked before page i + 1 is read
    assert checked == ([1, 1, 2, 2] if page_loop == "python" else [2, 2, 2, 2])
    assert streamed == [True, True, True, False]  # fed as read (the missing page was not)
    assert read.reasons == [None, "checksum", None, "missing"] and not read.ok
    assert read.bad_keys == [keys[1]] and keys[1] in bad and read.num_bytes == 2 * PAGE
    assert bytes(rows[:PAGE]) == payloads[0] and bytes(rows[2 * PAGE : 3 * PAGE]) == payloads[2]
    assert store.exists(keys) == [True, False, True, False]
    with pytest.raises(ValueError, match="3 keys but 4 payloads"):
        pageio.read_scattered(store, [pageio.ScatteredPages(codec, keys[:3], views)])
    store.close()


@pytest.mark.parametrize("flip", [None, 1_000, 300_000, 599_999])
def test_a_page_checked_run_by_run_as_it_is_read(tmp_path, flip: int | None,
                                                  page_loop: str) -> None:
    """A directory store reads a 600 KB page in runs and the check is fed each run as it is
    read: a good page verifies with that running checksum, a byte flipped in the first,
    a middle or the last run is a checksum miss (deleted)."""
    store = open_store(f"file://{tmp_path}/store")
    size = 600_000
    codec = PageCodec("fp", size)
    k = page_key("aaaa", f"{7:064x}", PoolName.KV)
    data = random.Random(8).randbytes(size)
    blob = bytearray(codec.encode(data, k))
    if flip is not None:
        blob[HEADER_BYTES + flip] ^= 0x04
    store.put({k: bytes(blob)})
    rows = memoryview(bytearray(size))
    views = [tuple(rows[j * 10_000 : (j + 1) * 10_000] for j in range(60))]
    fed: list[bool] = []
    verify = codec.verify_scattered

    def watched(head, payload, tail, n, key, running=None):  # noqa: ANN001, ANN202
        fed.append(running is not None)
        return verify(head, payload, tail, n, key, running)

    codec.verify_scattered = watched  # type: ignore[method-assign]
    read = pageio.read_scattered(store, [pageio.ScatteredPages(codec, [k], views)])
    assert fed == [True]
    assert read.reasons == [None if flip is None else "checksum"]
    assert store.exists([k]) == [flip is None]
    if flip is None:
        assert bytes(rows) == data
    store.close()


def test_sealed_pages_are_not_read_in_runs(tmp_path, page_loop: str) -> None:
    """A sealed page's tag is taken once it is read, so a read of sealed pages asks the
    directory store for no runs (their extra ``readv`` calls would only cost); an unsealed
    read does, in Python, or goes through the compiled loop (which reads in runs)."""
    from radixlink.stores.directory import DirectoryStore

    class Watched(DirectoryStore):
        asked: list[bool | str] = []

        def get_scattered(self, keys, targets, each=None, part=None):  # type: ignore[no-untyped-def]
            self.asked.append(part is not None)
            return super().get_scattered(keys, targets, each, part)

        def get_scattered_xxh3(self, keys, targets):  # type: ignore[no-untyped-def]
            read = super().get_scattered_xxh3(keys, targets)
            self.asked.append("xxh3" if read is not None else "no xxh3")
            return read

    store = Watched(tmp_path / "store")
    k = page_key("aaaa", f"{9:064x}", PoolName.KV)
    for codec in (PageCodec("fp", PAGE, secret=PageSecret(bytes(range(32)))),
                  PageCodec("fp", PAGE)):
        store.put({k: codec.encode(bytes(PAGE), k)})
        views = [(memoryview(bytearray(PAGE)),)]
        assert pageio.read_scattered(store, [pageio.ScatteredPages(codec, [k], views)]).ok
    assert Watched.asked == ([False, "no xxh3", True] if page_loop == "python"
                             else [False, "xxh3"])
    store.close()


def test_a_store_that_skips_each_is_a_clear_error() -> None:
    """A store whose ``get_scattered`` never calls ``each`` (a backend written against the
    older contract) fails the read with an error that names it, not deep in the policy."""

    class Silent(MemoryStore):
        def get_scattered(self, keys, targets, each=None):  # type: ignore[no-untyped-def]
            return super().get_scattered(keys, targets)

    store, codec = Silent(1 << 20), PageCodec("fp", PAGE)
    keys = [page_key("aaaa", f"{i:064x}", PoolName.KV) for i in range(2)]
    store.put({k: codec.encode(bytes(PAGE), k) for k in keys})
    views = [(memoryview(bytearray(PAGE)),) for _ in keys]
    with pytest.raises(ValueError, match="Silent.get_scattered called each for 0 of 2 keys"):
        pageio.read_scattered(store, [pageio.ScatteredPages(codec, keys, views)])
