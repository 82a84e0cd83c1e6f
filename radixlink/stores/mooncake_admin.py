"""The Mooncake master's HTTP admin server (``--metrics_port``): every key, key sizes and the
summary line, for ``scan`` / ``clear`` / ``stats`` of ``mooncake://`` stores.

Owns the HTTP requests and parsing their answers. Not the hot path; knows nothing of pages.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import quote

from radixlink.errors import StoreError

_QUERY_BATCH = 256
_MEM_RE = re.compile(r"Mem Storage: ([\d.]+) ([KMGT]?B) / ([\d.]+) ([KMGT]?B)")
_KEYS_RE = re.compile(r"Keys: (\d+)")
_UNIT = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}


class MasterAdmin:
    """HTTP calls to ``http://HOST:PORT`` (the master's admin server).

    Args:
        address: ``HOST:PORT``.
        timeout_s: per request.

    Raises (every method): ``StoreError`` when the server cannot be reached or answers
    something unexpected.
    """

    def __init__(self, address: str, timeout_s: float):
        self.base = f"http://{address}"
        self.timeout_s = timeout_s

    def _get(self, path: str) -> bytes:
        try:
            with urllib.request.urlopen(self.base + path, timeout=self.timeout_s) as reply:
                return bytes(reply.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return exc.read()
            raise StoreError(f"mooncake admin {self.base}{path.split('?')[0]}: HTTP "
                             f"{exc.code}") from exc
        except (OSError, ValueError) as exc:
            raise StoreError(f"mooncake admin {self.base} unreachable: {exc}; is the master's "
                             "--metrics_port this admin= address?") from exc

    def keys(self) -> list[str]:
        """Every key the master holds (any client's, radixlink's or not)."""
        return [line for line in self._get("/get_all_keys").decode().splitlines() if line]

    def sizes(self, keys: Sequence[str]) -> Iterator[tuple[str, int]]:
        """``(key, stored bytes)`` of each key that is still stored (others are skipped)."""
        plain = [key for key in keys if "," not in key]
        for start in range(0, len(plain), _QUERY_BATCH):
            batch = plain[start : start + _QUERY_BATCH]
            data = self._json("/batch_query_keys?keys=" + ",".join(quote(k, "") for k in batch))
            found = data.get("data") or {}
            for key in batch:
                entry = found.get(key) or {}
                if entry.get("ok") and entry.get("values"):
                    yield key, int(entry["values"][0]["size_"])
        for key in keys:  # NOTE: a ',' would split the batch query's list; ask one by one
            if "," in key:
                data = self._json("/query_key?key=" + quote(key, ""))
                if data.get("success") and data.get("data"):
                    yield key, int(data["data"][0]["size_"])

    def _json(self, path: str) -> dict[str, Any]:
        try:
            data = json.loads(self._get(path))
        except ValueError as exc:
            raise StoreError(f"mooncake admin {self.base}: not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise StoreError(f"mooncake admin {self.base}: unexpected answer {data!r:.80}")
        return data

    def summary(self) -> dict[str, int]:
        """``bytes``, ``capacity_bytes`` (memory segments) and ``pages`` (all keys)."""
        text = self._get("/metrics/summary").decode(errors="replace")
        mem, keys = _MEM_RE.search(text), _KEYS_RE.search(text)
        if mem is None or keys is None:
            raise StoreError(f"mooncake admin {self.base}: unexpected summary {text[:80]!r}")
        return {"bytes": int(float(mem.group(1)) * _UNIT[mem.group(2)]),
                "capacity_bytes": int(float(mem.group(3)) * _UNIT[mem.group(4)]),
                "pages": int(keys.group(1))}
