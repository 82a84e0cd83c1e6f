"""Deterministic, versioned page-chain hashes and cache namespaces (DESIGN.md section 6), and
the one token packer (``token_bytes``: the hash input, and the tree's keys).

Owns the byte layout of tokens, page hashes and namespace seeds (spec: docs/hashing.md).
Imports nothing else from radixlink but its memo (``seedmemo``); torch is only looked at if the
caller already imported it.
"""

from __future__ import annotations

import array
import hashlib
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from radixlink.seedmemo import NamespaceMemo

HASH_FORMAT_VERSION = 1
"""Version of the format in docs/hashing.md. It is not mixed into any hash: it is the first
field of every store key, and any change to the byte layout, the seed framing or the default
algorithm bumps it, so pages written under another format are never looked up."""

HASH_ALGOS: tuple[str, ...] = ("sha256", "xxh3")
DIGEST_SIZES: dict[str, int] = {"sha256": 32, "xxh3": 16}
"""Raw digest bytes per algorithm; hex digests are twice as long."""

NAMESPACE_TAG = b"radixlink.namespace\x00"
"""Domain tag that starts the framed namespace encoding."""

_NAMESPACE_ID_LEN = 16
_CHUNK_PAGES = 512
_MAX_U32 = 0xFFFFFFFF
TOKEN_BYTES = 4  # a packed token: uint32 little-endian
_U32 = np.dtype("<u4")
_BIG_ENDIAN = sys.byteorder == "big"
assert array.array("I").itemsize == 4, "array('I') is not 4 bytes on this platform"
_NamespaceLike = Any  # None | Namespace | tuple[str, ...] | list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Namespace:
    """What isolates caches: pages of different namespaces never share a hash.

    Empty fields mean "not set". A namespace whose fields are all empty is no namespace: its
    chain starts empty, exactly like ``namespace=None``.

    Attributes:
        model: model fingerprint (weights, tokenizer).
        layout: KV layout fingerprint (dtype, layers, heads, head dim, page size).
        cache_salt: per-deployment or per-user salt.
        extra_key: anything else that changes the KV (LoRA adapter, tenant).
    """

    model: str = ""
    layout: str = ""
    cache_salt: str = ""
    extra_key: str = ""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, str):
                raise ValueError(f"Namespace.{f.name} must be a str, got {value!r}")

    def parts(self) -> tuple[str, ...]:
        """The four fields in order: (model, layout, cache_salt, extra_key)."""
        return (self.model, self.layout, self.cache_salt, self.extra_key)

    def seed(self, algo: str = "sha256") -> bytes:
        """The chain start ``h_{-1}`` for ``algo``: b"" when every field is empty."""
        return _seed(_canonical(self.parts()), algo)

    @property
    def id(self) -> str:
        """Short stable hex id (16 chars) used in store keys; independent of the algorithm."""
        return _namespace_id(_canonical(self.parts()))


def layer_namespaces(base: Namespace | None, request: Namespace | None) -> Namespace | None:
    """The namespace a request of a cache with namespace ``base`` lives in (DESIGN.md 6).

    Layers, never replaces: ``base``'s model and layout always stay; the request adds its
    ``cache_salt`` and ``extra_key`` (tenant, LoRA). A field both set to different values is
    kept as both (framed, base first), so a request can narrow a cache-wide salt but never
    widen it. Idempotent: layering an already layered namespace again changes nothing.

    Raises:
        ValueError: ``request`` is not a Namespace, or names another model or layout than
            ``base`` (a request cannot move into another model's pages).
    """
    if request is None:
        return base
    if not isinstance(request, Namespace):
        raise ValueError(f"a request namespace must be a Namespace, got {request!r}")
    for name in ("model", "layout", "cache_salt", "extra_key"):
        check_no_separator(f"request namespace {name}", getattr(request, name),
                           "" if base is None else getattr(base, name))
    if base is None:
        return request
    for name in ("model", "layout"):
        mine, theirs = getattr(base, name), getattr(request, name)
        if theirs and theirs != mine:
            raise ValueError(
                f"request namespace {name}={theirs!r} differs from the cache's {mine!r}: a "
                "request adds cache_salt / extra_key on top of the cache's namespace and "
                f"cannot change its {name}; leave {name} empty"
            )
    return Namespace(model=base.model, layout=base.layout,
                     cache_salt=_join(base.cache_salt, request.cache_salt),
                     extra_key=_join(base.extra_key, request.extra_key))


def check_no_separator(name: str, value: str, base: str = "") -> None:
    """Refuse the layering separator ``\\x1f`` inside a namespace field: with it one layered
    namespace could spell another (``("a", "b\\x1fc")`` and ``("a\\x1fb", "c")``). A value
    already layered on ``base`` (``base + "\\x1f" + rest``, as ``layer_namespaces`` returns)
    is allowed when ``rest`` holds none.

    Raises:
        ValueError: ``value`` holds the separator elsewhere.
    """
    rest = value[len(base) + 1:] if base and value.startswith(base + "\x1f") else value
    if "\x1f" in rest:
        raise ValueError(f"{name}={value!r} holds the namespace separator \\x1f (it frames "
                         "layered namespaces); remove it from the value")


def _join(base: str, extra: str) -> str:
    if not base or not extra or base == extra or extra.startswith(base + "\x1f"):
        return extra or base
    # NOTE: a unit-separator frame: no field may hold \x1f itself (check_no_separator), so
    # ("a", "b") never equals another layering.
    return f"{base}\x1f{extra}"


def namespace_id(namespace: _NamespaceLike = None) -> str:
    """The store-key id of ``namespace`` (None, a Namespace, or a tuple/list of str parts).

    None, an empty Namespace and ``()`` share one id, as they share one chain.
    """
    return _namespace_id(_canonical_parts(namespace))


def page_hashes(
    tokens: Any,
    page_size: int,
    namespace: _NamespaceLike = None,
    *,
    parent: str | None = None,
    algo: str = "sha256",
) -> list[str]:
    """One hex digest per whole page: ``h_i = H(h_{i-1} || tokens_i as uint32 LE)``.

    ::

        tokens   |t0 .. t{P-1}|tP .. t{2P-1}| t2P .. (partial tail, ignored)
        hashes   |     h_0    |     h_1     |
        h_-1 = parent, else the namespace seed (b"" for no namespace)

    Args:
        tokens: token ids in ``[0, 2**32)``: a list/tuple/range of ints, a 1-D integer numpy
            array or a 1-D integer torch tensor (any device).
        page_size: tokens per page, a positive int.
        namespace: None, a Namespace, or a tuple/list of str parts. Ignored when ``parent``
            is given (the parent hash already commits to it).
        parent: hex digest of the page just before ``tokens`` (continues that chain), or None
            to start a new chain.
        algo: "sha256" (default, safe across tenants) or "xxh3" (xxh3-128, needs the
            ``xxhash`` package; for trusted single-tenant use).

    Returns:
        ``len(tokens) // page_size`` lowercase hex digests, page 0 first.

    Raises:
        ValueError: bad page_size, algo, parent or namespace, or tokens that are not ints in
            ``[0, 2**32)`` (floats, bools, negatives, too large, not 1-D).
        ImportError: ``algo="xxh3"`` without the xxhash package.
    """
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size <= 0:
        raise ValueError(f"page_size must be a positive int, got {page_size!r}")
    digest = _digest_fn(algo)
    parts = _canonical_parts(namespace)  # validated even when a parent makes it unused
    arr = _token_array(tokens)
    prev = _seed(parts, algo) if parent is None else _parse_parent(parent, algo)
    hexes: list[str] = []
    for chunk in _page_chunks(arr, page_size):
        digests = _sha256_chain(chunk, prev) if digest is None else _chain(chunk, prev, digest)
        prev = digests[-1]
        # NOTE: one C-level map for hex is cheaper than .hex() inside the loop.
        hexes += map(bytes.hex, digests)
    return hexes


def key_hashes(key: bytes, page_size: int, algo: str = "sha256", *,
               namespace: _NamespaceLike = None, parent: str | None = None) -> list[str]:
    """``page_hashes`` of tokens already packed by ``token_bytes`` (the tree's keys are the hash
    input as they are, and were checked when packed): one hex digest per whole page of ``key``,
    continuing ``parent`` or, without one, from ``namespace``'s seed.

    Raises:
        ValueError: a bad algo, parent or namespace.
    """
    digest = _digest_fn(algo)
    prev = (_seed(_canonical_parts(namespace), algo) if parent is None
            else _parse_parent(parent, algo))
    width = TOKEN_BYTES * page_size
    # NOTE: a void view gives one bytes object per page in one C call (as _page_chunks's)
    pages = np.frombuffer(key, dtype=f"V{width}", count=len(key) // width).tolist()
    digests = _sha256_chain(pages, prev) if digest is None else _chain(pages, prev, digest)
    return list(map(bytes.hex, digests))


def _sha256_chain(pages: list[bytes], prev: bytes) -> list[bytes]:
    """``h_i = sha256(h_{i-1} || page_i)`` for each page, starting from ``prev``."""
    # NOTE: copying a fresh context skips the per-call digest lookup of hashlib.sha256(),
    # and two update() calls skip the prev + page concatenation: ~10% on small pages.
    fresh = hashlib.sha256().copy
    out: list[bytes] = []
    append = out.append
    for page in pages:
        ctx = fresh()
        ctx.update(prev)
        ctx.update(page)
        prev = ctx.digest()
        append(prev)
    return out


def _chain(pages: list[bytes], prev: bytes, digest: Callable[[bytes], bytes]) -> list[bytes]:
    out: list[bytes] = []
    append = out.append
    for page in pages:
        prev = digest(prev + page)
        append(prev)
    return out


def _digest_fn(algo: str) -> Callable[[bytes], bytes] | None:
    """None for sha256 (inlined by the caller), else the one-shot digest function."""
    if algo == "sha256":
        return None
    if algo == "xxh3":
        try:
            import xxhash
        except ImportError as exc:
            raise ImportError(
                "algo='xxh3' needs the optional xxhash package: pip install xxhash "
                "(or use the default algo='sha256')"
            ) from exc
        fn: Callable[[bytes], bytes] = xxhash.xxh3_128_digest
        return fn
    raise ValueError(f"unknown hash algo {algo!r}; expected one of {', '.join(HASH_ALGOS)}")


def _hash_once(data: bytes, algo: str) -> bytes:
    digest = _digest_fn(algo)
    return hashlib.sha256(data).digest() if digest is None else digest(data)


def _frame(parts: tuple[str, ...]) -> bytes:
    """NAMESPACE_TAG, then per part: uint32 LE byte length + UTF-8 bytes."""
    chunks = [NAMESPACE_TAG]
    for part in parts:
        raw = part.encode("utf-8")
        chunks.append(len(raw).to_bytes(4, "little"))
        chunks.append(raw)
    return b"".join(chunks)


_MEMO = NamespaceMemo()


def namespace_memo_info() -> dict[str, int]:
    """What the process-wide memo of namespace seeds and ids keeps: ``entries`` and the
    ``chars`` of namespace parts they hold (bounded: see ``NamespaceMemo``)."""
    return _MEMO.info()


def _seed(parts: tuple[str, ...], algo: str) -> bytes:
    if not parts:
        _digest_fn(algo)  # still reject an unknown algo
        return b""
    seed: bytes = _MEMO.get(("seed", algo, parts), parts,
                            lambda: _hash_once(_frame(parts), algo))
    return seed


def _namespace_id(parts: tuple[str, ...]) -> str:
    ns_id: str = _MEMO.get(("id", parts), parts,
                           lambda: hashlib.sha256(_frame(parts)).hexdigest()[:_NAMESPACE_ID_LEN])
    return ns_id


def _canonical(parts: tuple[str, ...]) -> tuple[str, ...]:
    """Drop trailing empty parts: an unset field at the end is the same as an absent one."""
    end = len(parts)
    while end and not parts[end - 1]:
        end -= 1
    return parts[:end]


def _canonical_parts(namespace: _NamespaceLike) -> tuple[str, ...]:
    if namespace is None:
        return ()
    if isinstance(namespace, Namespace):
        return _canonical(namespace.parts())
    if isinstance(namespace, (tuple, list)):
        for part in namespace:
            if not isinstance(part, str):
                raise ValueError(f"namespace parts must be str, got {part!r} in {namespace!r}")
        return _canonical(tuple(namespace))
    raise ValueError(
        f"namespace must be None, a Namespace or a tuple/list of str, got {namespace!r}"
    )


def _parse_parent(parent: str, algo: str) -> bytes:
    size = DIGEST_SIZES[algo]
    try:
        raw = bytes.fromhex(parent) if isinstance(parent, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != size:
        raise ValueError(
            f"parent must be a {2 * size}-char hex {algo} digest (a page_hashes() result), "
            f"got {parent!r}"
        )
    return raw


def token_bytes(tokens: Any) -> bytes:
    """``tokens`` packed as uint32 little-endian bytes: the page-hash input (docs/hashing.md)
    and the tree's keys. Takes what ``page_hashes`` takes.

    Raises:
        ValueError: naming the offending value, dtype or type.
    """
    if type(tokens) is list:  # NOTE: every match and insert: converted and checked in C
        return _pack(tokens).tobytes()
    if isinstance(tokens, np.ndarray) and tokens.dtype == _U32 and tokens.ndim == 1:
        return tokens.tobytes()  # NOTE: packed already (a linker's lookup keeps such arrays)
    arr = _token_array(tokens)
    if not _in_range(arr):
        raise _range_error(arr)
    return arr.astype("<u4", copy=False).tobytes()


def _token_array(tokens: Any) -> np.ndarray:
    """``tokens`` as a 1-D integer array; lists are range-checked here, arrays later."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(tokens, torch.Tensor):
        if tokens.dtype == torch.bool or tokens.is_floating_point() or tokens.is_complex():
            raise ValueError(f"tokens must be an integer tensor, got dtype {tokens.dtype}")
        tokens = tokens.detach().cpu().numpy()
    if isinstance(tokens, np.ndarray):
        return _check_array(tokens)
    if isinstance(tokens, (str, bytes, bytearray, memoryview)) or not hasattr(tokens, "__iter__"):
        raise ValueError(f"tokens must be a sequence of ints, got {type(tokens).__name__}")
    if not isinstance(tokens, Sequence):
        tokens = list(tokens)
    return np.frombuffer(_pack(tokens), dtype="<u4")


def _pack(tokens: Sequence[Any]) -> array.array:
    """A sequence of ints as a little-endian uint32 ``array``, range-checked."""
    # NOTE: only the first element is checked for bool: a full scan costs more than hashing.
    if len(tokens) and isinstance(tokens[0], (bool, np.bool_)):
        raise ValueError(f"tokens must be ints, got bool {tokens[0]!r} at index 0")
    try:
        # NOTE: array('I') converts and range-checks in C without building an argument tuple:
        # ~5x faster than np.asarray(list), ~10% faster than struct.pack(*tokens).
        packed = array.array("I", tokens)
    except (TypeError, OverflowError):
        raise _bad_token(tokens) from None
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed


def _check_array(arr: np.ndarray) -> np.ndarray:
    """Shape and dtype checks; token values are range-checked by ``_page_chunks``."""
    if arr.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"tokens must have an integer dtype, got {arr.dtype}")
    return arr


def _page_chunks(arr: np.ndarray, page_size: int) -> Iterator[list[bytes]]:
    """The bytes of each whole page of ``arr`` (uint32 LE per token), ``_CHUNK_PAGES`` pages
    at a time. Raises ValueError (before the first chunk with it) for a token outside
    ``[0, 2**32)``, the partial tail included."""
    num_tokens = arr.shape[0] // page_size * page_size
    if not _in_range(arr[num_tokens:]):
        raise _range_error(arr)
    page_void, step = f"V{4 * page_size}", _CHUNK_PAGES * page_size
    # NOTE: a chunk at a time, tokens are checked, cast and split while in cache, and the
    # chunk's bytes and digests are freed and reused. Whole-call lists of them touched ~1 MB
    # of fresh memory per 4096 pages (~200 page faults a call); on 512K tokens this is 10-25%.
    whole = arr[:num_tokens]
    for start in range(0, num_tokens, step):
        part = whole[start : start + step]
        if not _in_range(part):
            raise _range_error(arr)
        # NOTE: a void view makes tolist() give one bytes object per page in a single C call,
        # so the hash loop does no slicing. Void items keep trailing zero bytes (unlike 'S').
        yield np.ascontiguousarray(part, dtype="<u4").view(page_void).tolist()


def _in_range(arr: np.ndarray) -> bool:
    """Whether every value of the integer array ``arr`` is in ``[0, 2**32)``."""
    if not arr.size or (arr.dtype.kind == "u" and arr.dtype.itemsize <= 4):
        return True
    if arr.dtype.itemsize <= 4:
        return int(arr.min()) >= 0
    # NOTE: seen as unsigned, negatives are huge, so one max() bounds both ends.
    return int(arr.view(arr.dtype.str.replace("i", "u")).max()) <= _MAX_U32


def _range_error(arr: np.ndarray) -> ValueError:
    """Error path only: name the first out-of-range extreme of ``arr``."""
    lo, hi = int(arr.min()), int(arr.max())
    bad = lo if lo < 0 else hi
    index = int(np.argmax(arr == bad))
    return ValueError(
        f"tokens must be in [0, 2**32), got {bad} at index {index} (dtype {arr.dtype})"
    )


def _bad_token(tokens: Sequence[Any]) -> ValueError:
    """Error path only: find the first element that is not an int in [0, 2**32)."""
    for index, value in enumerate(tokens):
        is_int = hasattr(value, "__index__") and not isinstance(value, (bool, np.bool_))
        if not is_int or not 0 <= int(value) <= _MAX_U32:
            return ValueError(f"tokens must be ints in [0, 2**32), got {value!r} at index {index}")
    return ValueError(f"tokens must be ints in [0, 2**32), got {type(tokens).__name__}")
