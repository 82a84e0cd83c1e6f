"""One request's page names on the scheduler: its page hashes, computed once and extended as
vLLM hashes more blocks (store keys come from ``KeyScheme.keys``, the page layer's
``PageKeys``).

Owns the per-request hash cache and the batched hex join (a few C-level string operations, no
per-page Python calls). Must not open stores or read vLLM's block manager.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radixlink.integrations.vllm.keys import KeyScheme

_SEP = "\n"  # NOTE: never in a hex hash, so it splits the joined hashes apart


def hex_names(raws: Sequence[bytes]) -> list[str]:
    """``[bytes(h).hex() for h in raws]`` in one join, one hex and one split."""
    if not raws:
        return []
    size = len(raws[0])
    if not size or len(set(map(len, raws))) != 1:
        return [bytes(h).hex() for h in raws]
    return b"".join(raws).hex(_SEP, size).split(_SEP)


class PageNames:
    """The page hashes of one request, page 0 first, extended as it grows.

    vLLM hashes are checked on every read: each chains over the whole prefix, so when the
    cached hash of the last page asked for still equals vLLM's, every cached hash before it
    does too; otherwise (vLLM rehashed the request) the cache starts over.
    """

    __slots__ = ("raws", "hashes")

    def __init__(self) -> None:
        self.raws: list[bytes] = []  # vLLM scheme: the block hash naming each page
        self.hashes: list[str] = []

    def first(self, scheme: KeyScheme, request: Any, block_size: int, num_pages: int) -> list[str]:
        """The request's first ``num_pages`` page hashes (fewer if not hashed yet; none when
        the scheme cannot name the request's pages)."""
        if scheme.scheme == "vllm":
            return self._vllm(scheme, request, block_size, num_pages)
        known = self.hashes
        if len(known) >= num_pages:
            return known[:num_pages]
        hashes = scheme.page_hashes(request, block_size, num_pages, known)
        if hashes is None:
            return []
        self.hashes = hashes
        return hashes

    def _vllm(self, scheme: KeyScheme, request: Any, block_size: int, num_pages: int) -> list[str]:
        ratio = block_size // scheme.hash_block_size
        block_hashes = request.block_hashes
        count = min(num_pages, len(block_hashes) // ratio)
        known = min(len(self.raws), count)
        if known and block_hashes[known * ratio - 1] != self.raws[known - 1]:
            self.raws, self.hashes, known = [], [], 0  # NOTE: vLLM rehashed the request
        if count > len(self.raws):
            # NOTE: the hash at a page's last hash block names the page (each vLLM hash chains
            # over the whole prefix; vLLM's BlockHashListWithBlockSize does the same)
            new = block_hashes[(len(self.raws) + 1) * ratio - 1 : count * ratio : ratio]
            self.raws.extend(new)
            self.hashes.extend(hex_names(new))
        return self.hashes[:count]
