"""Store URLs: scheme -> backend class (lazy imports), sizes like ``2GiB``, query parameters.

Owns URL parsing only; each backend's ``from_url`` reads its own parameters.
"""

from __future__ import annotations

import difflib
import importlib
import re
from decimal import Decimal
from typing import TYPE_CHECKING
from urllib.parse import unquote

if TYPE_CHECKING:
    from radixlink.stores.base import Store

# NOTE: strings, not classes, so that `redis` is imported only when a Redis URL is opened.
STORES: dict[str, str] = {
    "memory": "radixlink.stores.memory:MemoryStore",
    "file": "radixlink.stores.directory:DirectoryStore",
    "redis": "radixlink.stores.redis:RedisStore",
    "rediss": "radixlink.stores.redis:RedisStore",
    "unix": "radixlink.stores.redis:RedisStore",
    "redis+cluster": "radixlink.stores.cluster:ClusterStore",
    "rediss+cluster": "radixlink.stores.cluster:ClusterStore",
    "tiered": "radixlink.stores.tiered:TieredStore",
    "faults": "radixlink.stores.faults:FaultyStore",
    "mooncake": "radixlink.stores.mooncake:MooncakeStore",
}
INSTALL_HINTS: dict[str, str] = {"redis": "pip install 'radixlink[redis]'"}

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
MAX_SIZE = 2**63 - 1  # bytes: what file sizes and Redis's maxmemory can express
_MAX_SIZE_TEXT = 64  # characters: no size needs more
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in ``"2GiB"``, ``"500MB"``, ``"1024"`` or an int (KiB/MiB/GiB/TiB and the
    single letters K/M/G/T are powers of 1024; KB/MB/GB/TB are powers of 1000).

    Raises:
        ValueError: the text is not a size.
    """
    if isinstance(text, int):
        if not 0 <= text <= MAX_SIZE:
            raise ValueError(f"size must be from 0 to {MAX_SIZE} bytes, got {text}")
        return text
    match = _SIZE_RE.match(text) if len(text) <= _MAX_SIZE_TEXT else None
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"cannot parse size {text[:_MAX_SIZE_TEXT]!r}; use e.g. 2GiB, 500MB "
                         "or 1024")
    # NOTE: exact decimal arithmetic, not float: "1.1GB" is 1100000000 bytes and 400 nines
    # are a clean ValueError, not an OverflowError from int(inf)
    value = int(Decimal(match.group(1)) * _UNITS[unit])
    if value > MAX_SIZE:
        raise ValueError(f"size {text.strip()[:40]!r} is larger than {MAX_SIZE} bytes (8 EiB); "
                         "use a real capacity such as 50GiB")
    return value


def redact(url: str) -> str:
    """``url`` without its query and without a password (for messages and logs)."""
    scheme, sep, rest = url.partition("://")
    location = rest.split("?", 1)[0]
    if "@" in location:
        location = "***@" + location.rpartition("@")[2]
    return f"{scheme}{sep}{location}"


def split_url(url: str) -> tuple[str, str, dict[str, str]]:
    """``scheme://rest?query`` -> (scheme, rest, {param: value}). Values are percent-decoded
    (nested store URLs arrive decoded).

    Raises:
        ValueError: no scheme, or a parameter given twice (which one would win is a trap).
    """
    if "://" not in url:
        raise ValueError(f"store URL {redact(url)!r} has no scheme; known schemes: "
                         f"{', '.join(STORES)} (e.g. file:///var/cache/radixlink)")
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    rest, _, query = rest.partition("?")
    if "\x00" in unquote(rest):
        raise ValueError(f"{scheme}:// store URL: the location (host, port or path) "
                         f"{redact(scheme + '://' + rest)!r} contains a NUL byte (%00); "
                         "remove it")
    params: dict[str, str] = {}
    for part in query.split("&") if query else ():
        if not part:
            continue
        # NOTE: unquote, not parse_qs: '+' stays '+' (redis+cluster:// in a nested URL).
        name, _, value = part.partition("=")
        name, value = unquote(name), unquote(value)
        if "\x00" in name or "\x00" in value:
            raise ValueError(f"{scheme}:// store URL: parameter {name.split(chr(0))[0]!r} "
                             "contains a NUL byte (%00); remove it")
        if name in params:
            raise ValueError(f"{scheme}:// store URL: parameter {name!r} is given "
                             "twice; keep one")
        params[name] = value
    return scheme, rest, params


def open_store(url: str, *, read_only: bool = False) -> Store:
    """Open the store named by ``url`` (see ``STORES`` and docs/stores.md).

    Args:
        url: the store URL; every query parameter is checked here (names, types, ranges).
        read_only: open for inspection only: no directory is created, nothing is evicted
            or deleted on open, writes are refused (``radixlink store ls|stats``).

    Raises:
        ValueError: unknown scheme or bad parameters (the message names the parameter, the
            value and what is allowed).
        ImportError: the backend's optional dependency is missing (with an install hint).
        StoreError: the backend is unreachable or unusable.
    """
    scheme = split_url(url)[0]
    target = STORES.get(scheme)
    if target is None:
        close = difflib.get_close_matches(scheme, list(STORES), n=1)
        hint = f"did you mean {close[0]}://? " if close else ""
        raise ValueError(f"unknown store scheme {scheme!r}; {hint}known: {', '.join(STORES)}")
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        install = INSTALL_HINTS.get(exc.name or "")
        if install is None:
            raise
        raise ImportError(f"store {scheme}:// needs the {exc.name!r} package: {install}") from exc
    store: Store = getattr(module, class_name).from_url(url, read_only=read_only)
    return store


def open_reachable_store(url: str) -> Store:
    """``open_store(url)``, then one presence check (one round trip), so that an unreachable
    or unusable store fails here, at startup, rather than as silent misses later.

    Raises:
        ValueError, ImportError: as ``open_store``.
        StoreError: the store cannot be opened or does not answer (the message names the
            URL without its query or password); the store is closed.
    """
    from radixlink.errors import StoreError
    from radixlink.stores.keys import page_key

    store = open_store(url)
    try:
        store.exists([page_key("", "0" * 64, "kv")])
    except Exception as exc:  # noqa: BLE001 - whatever the backend raised, the store is unusable
        store.close()
        raise StoreError(f"the store at {redact(url)} is unreachable at startup: "
                         f"{' '.join(str(exc).split())}; check that it is up and that the URL "
                         "is right") from exc
    return store
