"""The connector's settings: ``kv_connector_extra_config`` parsed and checked once, and the vLLM
settings the keys depend on (prefix-caching hash, parallelism) refused when keys would differ.

Owns validation only. Must not open stores or touch KV tensors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from radixlink.hashing import HASH_ALGOS
from radixlink.stores import default_store_url
from radixlink.stores.registry import split_url

KEY_SCHEMES = ("vllm", "token_chain")
"""``vllm``: vLLM's own block hashes (LoRA, multimodal, prompt embeds and cache_salt included);
``token_chain``: radixlink's token-chain page hashes, for plain-token requests only."""

# NOTE: xxhash algorithms in vLLM start every chain from a per-process random seed unless
# PYTHONHASHSEED is set (vllm/v1/core/kv_cache_utils.py: resolve_none_hash_seed).
_RANDOM_SEED_ALGOS = ("xxhash", "xxhash_cbor")

EXTRA_CONFIG_KEYS: dict[str, str] = {
    "store": "store URL (default: radixlink's directory store, file://~/.cache/radixlink/store)",
    "keys": "page keys: 'vllm' (default, vLLM block hashes) or 'token_chain'",
    "token_chain_algo": "hash of the token chain: 'sha256' (default) or 'xxh3'",
    "namespace": "model part of the key namespace (default: the model path or name)",
    "load": "look up and load pages (default true)",
    "save": "write computed pages to the store (default true)",
    "num_threads": "store I/O threads per worker (default 2)",
    "max_inflight_save_mb": "host bytes of queued saves per worker, in MiB (default 1024)",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectorSettings:
    """The parsed ``kv_connector_extra_config`` (every key is in ``EXTRA_CONFIG_KEYS``)."""

    store_url: str
    key_scheme: str = "vllm"
    token_chain_algo: str = "sha256"
    namespace: str = ""
    load: bool = True
    save: bool = True
    num_threads: int = 2
    max_inflight_save_bytes: int = 1 << 30

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> ConnectorSettings:
        """Parse and check ``kv_connector_extra_config``.

        Raises:
            ValueError: an unknown key (typos fail loudly) or a value of the wrong type or
                range; the message names the key, the value and what is allowed.
        """
        extra = dict(extra or {})
        unknown = sorted(set(extra) - set(EXTRA_CONFIG_KEYS))
        if unknown:
            allowed = "; ".join(f"{k}: {v}" for k, v in EXTRA_CONFIG_KEYS.items())
            raise ValueError(
                f"RadixlinkConnector: unknown kv_connector_extra_config key(s) {unknown}; "
                f"allowed: {allowed}"
            )
        scheme = _choice(extra, "keys", "vllm", KEY_SCHEMES)
        algo = _choice(extra, "token_chain_algo", "sha256", HASH_ALGOS)
        threads = _int(extra, "num_threads", 2, 1, 64)
        inflight_mb = _int(extra, "max_inflight_save_mb", 1024, 1, 1 << 20)
        store_url = extra.get("store") or default_store_url()
        if not isinstance(store_url, str):
            raise ValueError(f"RadixlinkConnector: 'store' must be a URL string, got {store_url!r}")
        namespace = extra.get("namespace", "")
        if not isinstance(namespace, str):
            raise ValueError(f"RadixlinkConnector: 'namespace' must be a str, got {namespace!r}")
        return cls(
            store_url=store_url, key_scheme=scheme, token_chain_algo=algo, namespace=namespace,
            load=_bool(extra, "load", True), save=_bool(extra, "save", True),
            num_threads=threads, max_inflight_save_bytes=inflight_mb << 20,
        )  # fmt: skip


def check_hash_settings(hash_algo: str, key_scheme: str) -> None:
    """Refuse vLLM hash settings under which two instances compute different page keys.

    vLLM chains block hashes from ``NONE_HASH``. For ``sha256`` / ``sha256_cbor`` its seed is
    fixed (or PYTHONHASHSEED), so every instance agrees. For ``xxhash`` / ``xxhash_cbor`` the
    seed is random per process unless PYTHONHASHSEED is set, so no instance would ever find
    another's pages.

    Raises:
        ValueError: ``key_scheme == "vllm"`` with an xxhash algorithm and no PYTHONHASHSEED.
    """
    if key_scheme != "vllm" or hash_algo not in _RANDOM_SEED_ALGOS:
        return
    if os.environ.get("PYTHONHASHSEED") is not None:
        return
    raise ValueError(
        f"RadixlinkConnector: --prefix-caching-hash-algo {hash_algo} starts vLLM's block-hash "
        "chain from a random per-process seed, so instances would never share pages. Use "
        "--prefix-caching-hash-algo sha256 (the default) or sha256_cbor, or export the same "
        "PYTHONHASHSEED (e.g. PYTHONHASHSEED=0) to every vLLM instance sharing the store, or "
        "set kv_connector_extra_config {\"keys\": \"token_chain\"}"
    )


# vLLM's CacheHitSource values (vllm/v1/metrics/cache_hit_source.py, 0.32+): where a store
# scheme's pages live. A remote server is "external_unspecified" (vLLM: "remote store").
_HIT_SOURCES = {"file": "disk", "memory": "host"}
_WRAPPERS = {"faults": "inner", "tiered": "back"}  # NOTE: tiered presence is the back's


def hit_source(store_url: str) -> str:
    """The ``CacheHitSource`` value vLLM counts this store's hits under: ``disk`` for a
    directory store, ``host`` for ``memory://``, ``external_unspecified`` for a remote one
    (Redis, Redis Cluster, Mooncake); ``faults://`` and ``tiered://`` take their inner / back
    store's. Never raises: a URL it cannot read is ``external_unspecified``."""
    for _ in range(8):  # NOTE: bounded: wrappers nest, a cycle cannot
        try:
            scheme, _, params = split_url(store_url)
        except ValueError:
            break
        inner = params.get(_WRAPPERS.get(scheme, ""), "")
        if not inner:
            return _HIT_SOURCES.get(scheme, "external_unspecified")
        store_url = inner
    return "external_unspecified"


def tp_rank_and_size(parallel_config: Any) -> tuple[int, int]:
    """This process's tensor-parallel rank and the TP size.

    Raises:
        ValueError: pipeline or decode-context parallelism (keys would need the stage).
    """
    tp_size = int(parallel_config.tensor_parallel_size)
    pp_size = int(getattr(parallel_config, "pipeline_parallel_size", 1))
    dcp_size = int(getattr(parallel_config, "decode_context_parallel_size", 1))
    if pp_size != 1 or dcp_size != 1:
        raise ValueError(
            f"RadixlinkConnector supports tensor parallelism only; got pipeline_parallel_size="
            f"{pp_size}, decode_context_parallel_size={dcp_size}. Run with both set to 1"
        )
    # NOTE: vLLM sets parallel_config.rank to the worker's global rank; with PP = 1 the
    # TP rank is that modulo the TP size (data-parallel engines each have their own).
    return int(getattr(parallel_config, "rank", 0)) % tp_size, tp_size


def _choice(extra: Mapping[str, Any], key: str, default: str, allowed: tuple[str, ...]) -> str:
    value = extra.get(key, default)
    if value not in allowed:
        raise ValueError(f"RadixlinkConnector: {key!r} must be one of {allowed}, got {value!r}")
    return str(value)


def _int(extra: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = extra.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(
            f"RadixlinkConnector: {key!r} must be an int in [{low}, {high}], got {value!r}"
        )
    return value


def _bool(extra: Mapping[str, Any], key: str, default: bool) -> bool:
    value = extra.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"RadixlinkConnector: {key!r} must be true or false, got {value!r}")
    return value
