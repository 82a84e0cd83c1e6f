"""Store keys for vLLM's KV cache groups: one radixlink pool per group, namespaced by model and
group layout, and the per-page hashes of a request (vLLM block hashes or radixlink token chains).

Owns naming only (the key bytes are the page layer's ``PageKeys``). Must not open stores or
touch tensors; both connector roles build the same ``GroupLayout`` list from the same
configs, so scheduler and workers agree on every key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from radixlink.contract import PoolName
from radixlink.hashing import Namespace, page_hashes
from radixlink.pages.keys import PageKeys


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupLayout:
    """One prefix-cacheable vLLM KV cache group as a radixlink pool.

    Attributes:
        group_id: the group's index in ``KVCacheConfig.kv_cache_groups``.
        pool: ``KV`` (full attention: every page of a prefix) or ``SWA`` (sliding window:
            the ``window_pages`` pages before the prefix end).
        window_pages: SWA only: ``ceil((sliding_window - 1) / block_size)``, the blocks vLLM
            keeps for the next token (``SlidingWindowManager``); 0 for full attention.
        block_size: tokens per page (the group's block size).
        layer_names: the group's layers, in vLLM's order: a page holds them all, in this order.
        description: the layout text of the namespace (kind, heads, content bytes, dtype,
            block size, layer count and names digest, physical layout, TP size).
    """

    group_id: int
    pool: PoolName
    window_pages: int
    block_size: int
    layer_names: tuple[str, ...]
    description: str


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyScheme:
    """How pages of a request are named (shared by the scheduler and every worker).

    Attributes:
        model: the model part of every namespace.
        scheme: ``"vllm"`` (vLLM block hashes) or ``"token_chain"`` (radixlink page hashes).
        algo: the token-chain hash (``sha256`` / ``xxh3``); vLLM's algorithm otherwise.
        hash_block_size: tokens per vLLM block hash (``KVCacheConfig.hash_block_size``).
    """

    model: str
    scheme: str
    algo: str
    hash_block_size: int

    def namespace_id(self, group: GroupLayout, cache_salt: str = "") -> str:
        """The namespace id of ``group``'s pages (plus the request's salt for token chains)."""
        return _namespace_id(self.model, group.description, cache_salt,
                             f"{self.scheme}:{self.algo}")  # fmt: skip

    def page_hashes(
        self, request: Any, block_size: int, num_pages: int, known: Sequence[str] = ()
    ) -> list[str] | None:
        """Hex hashes of the request's first ``num_pages`` whole pages (fewer if the request
        has fewer hashed pages), or None when this scheme cannot name them.

        Args:
            request: the vLLM ``Request``.
            block_size: tokens per page.
            num_pages: how many leading pages to name.
            known: token chains only: hashes already computed for the leading pages (the
                chain continues from the last one instead of rehashing the prefix).

        Token chains name only plain-token requests: a LoRA, multimodal or prompt-embeds
        request gets None (it is neither looked up nor saved).
        """
        if self.scheme == "vllm":
            ratio = block_size // self.hash_block_size
            block_hashes = request.block_hashes
            count = min(num_pages, len(block_hashes) // ratio)
            # NOTE: each vLLM hash chains over the whole prefix, so the hash at a page's last
            # hash block names the page (vLLM's BlockHashListWithBlockSize does the same).
            return [bytes(block_hashes[(i + 1) * ratio - 1]).hex() for i in range(count)]
        if request.lora_request or request.mm_features or request.prompt_embeds is not None:
            return None
        count = min(num_pages, request.num_tokens // block_size)
        start = min(len(known), count)
        tokens = request.all_token_ids[start * block_size : count * block_size]
        parent = known[start - 1] if start else None
        return [*known[:start], *page_hashes(tokens, block_size, parent=parent, algo=self.algo)]

    def keys(
        self, group: GroupLayout, hashes: Sequence[str], rank: int, cache_salt: str = ""
    ) -> list[str]:
        """The store keys of ``hashes`` in ``group`` on TP rank ``rank``: one join and one
        split (``PageKeys`` caches the key template of each group, rank and salt)."""
        return _page_keys(rank).keys(group.pool, hashes, self._ns_id(group, cache_salt))

    def _ns_id(self, group: GroupLayout, cache_salt: str) -> str:
        return self.namespace_id(group, cache_salt if self.scheme == "token_chain" else "")


@lru_cache(maxsize=64)
def _page_keys(rank: int) -> PageKeys:
    """The key scheme of TP rank ``rank`` (vLLM's groups are never replicated across ranks)."""
    return PageKeys(rank)


@lru_cache(maxsize=4096)
def _namespace_id(model: str, layout: str, cache_salt: str, extra_key: str) -> str:
    """Namespace ids, memoised: one per group and cache salt, asked for at every lookup."""
    return Namespace(model=model, layout=layout, cache_salt=cache_salt, extra_key=extra_key).id


def group_layouts(
    kv_cache_config: Any, *, layout_name: str, tp_size: int
) -> tuple[list[GroupLayout], str]:
    """The prefix-cacheable groups of ``kv_cache_config`` as pools, or ``([], reason)`` when
    the connector cannot take part (a Mamba or other state group, mixed block sizes).

    Args:
        kv_cache_config: vLLM's ``KVCacheConfig``.
        layout_name: vLLM's resolved physical KV cache layout (e.g. ``LBNHC``).
        tp_size: the tensor-parallel size (pages of different TP sizes never mix).
    """
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    groups = kv_cache_config.kv_cache_groups
    out: list[GroupLayout] = []
    for group_id in kv_cache_config.prefix_cacheable_group_ids:
        spec = groups[group_id].kv_cache_spec
        if isinstance(spec, SlidingWindowSpec):
            pool = PoolName.SWA
            window = max(1, -(-(spec.sliding_window - 1) // spec.block_size))
        elif isinstance(spec, FullAttentionSpec):
            pool, window = PoolName.KV, 0
        else:
            return [], f"group {group_id} is a {type(spec).__name__} (only attention pages)"
        names = tuple(groups[group_id].layer_names)
        names_digest = hashlib.sha256("\x00".join(names).encode()).hexdigest()[:12]
        description = (
            f"vllm-kv;{pool.value};w{window};H{spec.num_heads};C{spec.state_content_size_bytes};"
            f"{spec.dtype};B{spec.block_size};L{len(names)}:{names_digest};{layout_name};"
            f"tp{tp_size}"
        )
        out.append(GroupLayout(
            group_id=group_id, pool=pool, window_pages=window,
            block_size=spec.block_size, layer_names=names, description=description,
        ))  # fmt: skip
    if len({g.block_size for g in out}) > 1:
        sizes = sorted({g.block_size for g in out})
        return [], f"prefix-cacheable groups have different block sizes {sizes}"
    if not out:
        return [], "no prefix-cacheable attention group"
    return out, ""
