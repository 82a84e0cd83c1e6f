"""Real vLLM engines as child processes (``node_process``), each started fresh, driven by
command and stopped by PID: the nodes of the real-engine tests, ``demo --engine vllm`` and
``bench vllm``.

Owns the node spec and its environment (the process and its protocol are
``integrations.child``'s). Must not decide what runs on the nodes.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from radixlink.integrations.child import ChildProcess

CONNECTOR = "RadixlinkConnector"
CONNECTOR_MODULE = "radixlink.integrations.vllm"


def connector_config(store: str, **extra: Any) -> dict[str, Any]:
    """The ``--kv-transfer-config`` of a node whose connector uses ``store``."""
    return {"kv_connector": CONNECTOR, "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"store": store, **extra}}


def engine_env(kv_cache_gib: int, *, num_threads: int | None = None) -> dict[str, str]:
    """The environment every node gets, with or without the connector.

    NOTE: vLLM CPU reserves one more core for a process that has a KV connector
    (``VLLM_CPU_NUM_OF_RESERVED_CPU`` unset); on a small machine the worker then computes on
    another core set than a run without the connector, which changed bf16 outputs. Fixing
    the reservation makes every node bind alike.
    """
    env = {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "VLLM_CPU_NUM_OF_RESERVED_CPU": "1",
           "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
           "TOKENIZERS_PARALLELISM": "false", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if num_threads is not None:
        env["OMP_NUM_THREADS"] = str(num_threads)
    return env


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """One vLLM engine.

    Attributes:
        model: a Hugging Face model directory (``hf_export.export``).
        kv_transfer_config: ``connector_config(...)``, or None for no connector.
        prefix_caching: vLLM's own device prefix cache.
        dtype: ``float32`` keeps greedy outputs independent of how a prefix was chunked.
        max_model_len, max_num_batched_tokens, max_num_seqs, block_size,
            num_gpu_blocks_override: vLLM's settings (None: vLLM's default; the last one
            sizes the KV cache in blocks, for preemption tests).
        enforce_eager: no torch.compile (a start takes far less; both runs of a comparison
            use the same setting).
        kv_cache_gib: ``VLLM_CPU_KVCACHE_SPACE``.
        kv_events_config: vLLM's ``KVEventsConfig`` fields (``--kv-events-config``), or None.
        env: more environment variables for the process.
    """

    model: str
    kv_transfer_config: dict[str, Any] | None = None
    prefix_caching: bool = True
    dtype: str = "float32"
    max_model_len: int = 2048
    max_num_batched_tokens: int | None = 2048
    enforce_eager: bool = True
    max_num_seqs: int | None = None
    block_size: int | None = None
    num_gpu_blocks_override: int | None = None
    kv_cache_gib: int = 1
    kv_events_config: dict[str, Any] | None = None
    env: dict[str, str] = field(default_factory=dict)


class VllmNode:
    """A started vLLM process. Use as a context manager; ``close`` stops it by PID.

    Args:
        spec: what to build.
        log_path: where the process's own output goes (kept for a failure's message).
        python: the interpreter (default: this one; it must have vLLM).
        start_timeout_s: how long the engine may take to load.
    """

    def __init__(self, spec: NodeSpec, log_path: str | Path, *, python: str | None = None,
                 start_timeout_s: float = 600.0):  # fmt: skip
        self.spec = spec
        self.log_path = Path(log_path)
        payload = {k: v for k, v in asdict(spec).items() if k not in ("env", "kv_cache_gib")}
        self._child = ChildProcess(
            "radixlink.integrations.vllm.node_process", json.dumps(payload), log_path,
            env={**os.environ, **engine_env(spec.kv_cache_gib), **spec.env}, python=python,
            start_timeout_s=start_timeout_s, what="vLLM node")
        self.load_s = float(self._child.ready["load_s"])

    @property
    def pid(self) -> int:
        return self._child.pid

    def generate(self, prompts: list[list[int]], max_tokens: int,
                 timeout_s: float = 600.0) -> dict[str, Any]:  # fmt: skip
        """Greedy outputs of ``prompts`` in one batch: ``{"results": [{"output_ids",
        "ttft_s", "num_cached_tokens"}], "wall_s"}``."""
        return self._child.call({"op": "generate", "prompts": prompts,
                                 "max_tokens": max_tokens}, timeout_s)

    def reset_prefix_cache(self) -> bool:
        """Empty vLLM's device prefix cache (the next request must come from the store)."""
        return bool(self._child.call({"op": "reset_prefix_cache"}, 120.0)["ok"])

    def metrics(self) -> dict[str, float]:
        """vLLM's own counters (``LLM.get_metrics``), ``name{labels}`` -> value."""
        return self._child.call({"op": "metrics"}, 120.0)["metrics"]

    def log_tail(self, num_lines: int = 40) -> str:
        return self._child.log_tail(num_lines)

    def close(self) -> None:
        """Ask the engine to exit; past 60 s, kill its whole process group (vLLM's
        engine-core child shares it). Idempotent."""
        self._child.close(60.0)

    def __enter__(self) -> VllmNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
