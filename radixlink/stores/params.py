"""Store URL query parameters: every backend declares its own, and they are checked at open.

Owns parsing, types and ranges, "did you mean" hints for typos, and reading page secrets
(``auth=env:NAME`` / ``auth=file:/path``, with ``mac=`` naming their MAC). Knows nothing of any
backend. Messages name the parameter, the value and what is allowed; never a password or a
secret.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from radixlink.stores.pagefiles import NotAPage, read_page
from radixlink.stores.seal import DEFAULT_MAC, MAC_IDS, PageSecret, check_mac

MAX_SECRET_FILE_BYTES = 4096
_INT_RE = re.compile(r"^[+-]?\d+$")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class Param:
    """One query parameter: how to parse it, its default and what it allows (for messages).

    ``parse`` raises ``ValueError`` for a bad value; ``secret`` hides the value in messages.
    """

    parse: Callable[[str], Any]
    default: Any
    allowed: str
    secret: bool = False


def integer(low: int, high: int | None = None) -> Callable[[str], int]:
    """A parser of ints in ``[low, high]``."""

    def parse(text: str) -> int:
        if not _INT_RE.match(text.strip()):
            raise ValueError(text)
        value = int(text)
        if value < low or (high is not None and value > high):
            raise ValueError(text)
        return value

    return parse


def number(
    low: float, high: float | None = None, *, low_open: bool = False
) -> Callable[[str], float]:
    """A parser of finite floats in ``[low, high]`` (``(low, high]`` with ``low_open``)."""

    def parse(text: str) -> float:
        value = float(text)  # ValueError for non-numbers
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(text)
        if value < low or (low_open and value == low) or (high is not None and value > high):
            raise ValueError(text)
        return value

    return parse


def boolean(text: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case)."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(text)


def choice(*values: str) -> Callable[[str], str]:
    """A parser accepting exactly one of ``values`` (case-insensitive)."""

    def parse(text: str) -> str:
        if text.lower() not in values:
            raise ValueError(text)
        return text.lower()

    return parse


def text(value: str) -> str:
    """Any non-empty string."""
    if not value:
        raise ValueError(value)
    return value


def size(low: int = 1) -> Callable[[str], int]:
    """A parser of sizes such as ``2GiB`` (``parse_size``) of at least ``low`` bytes."""

    def parse(value: str) -> int:
        from radixlink.stores.registry import parse_size  # NOTE: registry imports us

        parsed = parse_size(value)
        if parsed < low:
            raise ValueError(value)
        return parsed

    return parse


def size_or_percent(max_percent: float) -> Callable[[str], tuple[str, float]]:
    """``"5%"`` -> ("percent", 5.0) (at most ``max_percent``) or a size -> ("bytes", n)."""

    def parse(value: str) -> tuple[str, float]:
        if value.strip().endswith("%"):
            percent = number(0.0, max_percent)(value.strip()[:-1])
            return "percent", percent
        return "bytes", float(size(0)(value))

    return parse


def secret_ref(value: str) -> bytes:
    """Load the page secret named by ``env:NAME`` or ``file:/abs/path``.

    Raises:
        ValueError: the form is wrong, the variable is unset, the file is unreadable or too
            large, or the secret is shorter than 16 bytes. Messages name the variable or the
            path, never the secret.
    """
    from radixlink.stores.codec import MIN_SECRET_BYTES

    kind, _, where = value.partition(":")
    fix = "generate one with: python -c 'import secrets; print(secrets.token_hex(32))'"
    if kind == "env" and where:
        found = os.environ.get(where, "")
        if not found:
            raise ValueError(f"auth=env:{where}: the environment variable {where} is not set "
                             f"or empty; set it to the page secret ({fix})")
        secret = found.encode()
    elif kind == "file" and where.startswith("/"):
        secret = _read_secret_file(where).rstrip(b"\r\n")
    else:
        raise ValueError("auth must be env:VARNAME or file:/absolute/path (the secret itself "
                         "never goes in a URL)")
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"auth={kind}:{where}: the secret is {len(secret)} bytes; use at least "
                         f"{MIN_SECRET_BYTES} ({fix})")
    return secret


def _read_secret_file(path: str) -> bytes:
    """The secret file at ``path``, opened as untrusted input like a page file: no symlink
    followed at its name, no blocking open (a FIFO), a regular file of at most
    ``MAX_SECRET_FILE_BYTES`` (checked with ``fstat`` before reading)."""
    try:
        return read_page(path, MAX_SECRET_FILE_BYTES, None)
    except NotAPage as exc:
        raise ValueError(f"auth=file:{path}: refused: {exc.strerror}; the secret must be a "
                         f"regular file of at most {MAX_SECRET_FILE_BYTES} bytes (name the "
                         "link's target itself, e.g. its realpath)") from None
    except OSError as exc:
        raise ValueError(f"auth=file:{path}: cannot read the secret file: "
                         f"{exc.strerror or exc}") from None


AUTH = Param(secret_ref, None, "env:VARNAME or file:/absolute/path", secret=True)
#: Every store that takes ``auth=`` takes ``mac=`` too (``read_params`` adds it).
MAC = Param(check_mac, None, f"one of {', '.join(MAC_IDS)} (default {DEFAULT_MAC})")


def _sealed(scheme: str, secret: bytes | None, mac: str | None) -> PageSecret | None:
    """``auth=``'s secret with ``mac=``'s algorithm; ``mac=`` alone is refused."""
    if secret is None:
        if mac is not None:
            raise ValueError(f"{scheme}:// store URL: mac={mac} names the MAC of sealed pages "
                             "but the URL has no auth=; add auth=env:VARNAME or "
                             "auth=file:/absolute/path, or drop mac=")
        return None
    return PageSecret(secret, mac or DEFAULT_MAC)


def read_params(
    scheme: str,
    params: Mapping[str, str],
    spec: Mapping[str, Param],
    refused: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The parsed value of every parameter in ``spec`` (its default when absent).

    Args:
        scheme: the URL's scheme, for messages.
        params: the URL's query parameters (name -> raw value).
        spec: the parameters this store accepts.
        refused: parameters that are known but make no sense here -> why (and the fix).

    A spec with ``auth`` also accepts ``mac``; ``auth``'s value is then a ``PageSecret``
    carrying the MAC algorithm (``mac=`` without ``auth=`` is refused).

    Raises:
        ValueError: one message naming the parameter, the value (unless secret) and what is
            allowed; for an unknown name the closest allowed names ("did you mean").
    """
    if "auth" in spec:
        spec = {**spec, "mac": MAC}
    for name, value in params.items():
        if name in spec:
            continue
        if refused and name in refused:
            raise ValueError(f"{scheme}:// store URL: parameter {name}={value!r} is not "
                             f"allowed: {refused[name]}")
        close = difflib.get_close_matches(name, list(spec), n=2, cutoff=0.6)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise ValueError(f"{scheme}:// store URL: unknown parameter {name!r}; {hint}"
                         f"allowed: {', '.join(sorted(spec)) or 'none'}")
    out: dict[str, Any] = {}
    for name, param in spec.items():
        if name not in params:
            out[name] = param.default
            continue
        raw = params[name]
        try:
            out[name] = param.parse(raw)
        except ValueError as exc:
            if param.secret:  # NOTE: secret parsers word their own messages, without the value
                raise ValueError(f"{scheme}:// store URL: {exc}") from None
            shown = raw if len(raw) <= 40 else f"{raw[:40]}... ({len(raw)} characters)"
            raise ValueError(f"{scheme}:// store URL: parameter {name}={shown!r} is invalid; "
                             f"expected {param.allowed}") from None
    if "auth" in spec:
        out["auth"] = _sealed(scheme, out["auth"], out["mac"])
    return out
