"""The radixlink part of SGLang's JSON plug-in configs, parsed and checked once at startup.

Owns key names, defaults and validation. Must not import SGLang or open stores.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from radixlink.stores.directory import default_store_url

# NOTE: keys SGLang itself reads from (or, for file_storage_path, adds to) the same JSON object
# before it reaches the backend; passed through, never rejected. SGLang 0.5.23 pops its
# prefetch_* / hicache_storage_pass_prefix_keys / tp_lcm_size knobs first, and sets
# file_storage_path from --file-storage-path (for its own file backend; radixlink's store
# comes from "store" only).
SGLANG_HICACHE_KEYS = frozenset(
    {"backend_name", "module_path", "class_name", "interface_v1", "tp_lcm_size",
     "file_storage_path", "prefetch_threshold", "prefetch_timeout_base",
     "prefetch_timeout_per_ki_token", "hicache_storage_pass_prefix_keys"}
)
SUPPORTED_MODELS = (
    "radixlink moves the kv, swa and mamba pools only: dense and GQA attention models "
    "(Llama, Qwen, Mistral), MLA models without a sparse indexer (DeepSeek V2/V3), "
    "sliding-window hybrids (gpt-oss, Gemma 3) and Mamba hybrids (Qwen3-Next, Nemotron-H); "
    "DSA / indexer pools (DeepSeek V3.2), DeepSeek V4's compressed pools and quantized KV "
    "are not supported (docs/integrations.md)"
)
_CHECKSUMS = ("auto", "xxh3", "crc32")


@dataclass(frozen=True, slots=True, kw_only=True)
class IntegrationSettings:
    """What both plug points read from their extra config.

    Attributes:
        store: the store URL (docs/stores.md); radixlink's default directory store when absent.
        namespace: isolates caches sharing one store; defaults to the model path SGLang gives.
        checksum: the page checksum (``auto``, ``xxh3`` or ``crc32``).
    """

    store: str
    namespace: str
    checksum: str = "auto"


KNOWN_KEYS = ("store", "namespace", "checksum")


def parse_settings(
    config: Mapping[str, Any] | None, *, model_name: str | None, passthrough: frozenset[str]
) -> IntegrationSettings:
    """Check ``config`` (the plug point's JSON object) and fill in defaults.

    Args:
        config: ``linker_extra_config`` or ``--hicache-storage-backend-extra-config``.
        model_name: the engine's model path, the default namespace.
        passthrough: keys the engine owns in the same object (ignored here).

    Raises:
        ValueError: an unknown key (a typo fails loudly, naming the allowed keys) or a value
            of the wrong type.
    """
    config = dict(config or {})
    unknown = sorted(set(config) - set(KNOWN_KEYS) - passthrough)
    if unknown:
        raise ValueError(
            f"radixlink: unknown config key(s) {unknown}; allowed: {list(KNOWN_KEYS)} "
            "(see docs/integrations.md)"
        )
    store = config.get("store") or default_store_url()
    namespace = config.get("namespace") or model_name or ""
    checksum = config.get("checksum", "auto")
    if not isinstance(store, str) or "://" not in store:
        raise ValueError(
            f"radixlink: 'store' must be a store URL such as file:///var/cache/radixlink or "
            f"redis://host:6379/0, got {store!r}"
        )
    if not isinstance(namespace, str):
        raise ValueError(f"radixlink: 'namespace' must be a string, got {namespace!r}")
    if checksum not in _CHECKSUMS:
        raise ValueError(f"radixlink: 'checksum' must be one of {_CHECKSUMS}, got {checksum!r}")
    return IntegrationSettings(store=store, namespace=namespace, checksum=checksum)
