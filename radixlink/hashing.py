"""Deterministic, versioned page-chain hashes and cache namespaces (DESIGN.md section 6), over
tokens packed by ``radixlink.tokens``.

Owns the byte layout of tokens, page hashes and namespace seeds (spec: docs/hashing.md).
Imports nothing else from radixlink but its memo (``seedmemo``) and the token packer
(``tokens``).
"""

from __future__ import annotations

import array
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from radixlink.seedmemo import NamespaceMemo
from radixlink.tokens import TOKEN_BYTES, page_chunks, token_array

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
    arr = token_array(tokens)
    prev = _seed(parts, algo) if parent is None else _parse_parent(parent, algo)
    hexes: list[str] = []
    for chunk in page_chunks(arr, page_size):
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
    # NOTE: a void view gives one bytes object per page in one C call (as tokens.page_chunks's)
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
