"""Real vLLM engines as child processes (``node_process``), each started fresh, driven by
command and stopped by PID: the nodes of the real-engine tests, ``demo --engine vllm`` and
``bench vllm``.

Owns the node spec, the process, its environment and the reply protocol. Must not decide what
runs on the nodes.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from radixlink.integrations.vllm.node_process import REPLY

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


class NodeError(RuntimeError):
    """A node failed to start or to answer; carries the tail of its log."""


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
        env = {**os.environ, **engine_env(spec.kv_cache_gib), **spec.env}
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed by close()
        self._proc = subprocess.Popen(
            [python or sys.executable, "-m", "radixlink.integrations.vllm.node_process",
             json.dumps(payload)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=env, start_new_session=True)
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        ready = self._wait(start_timeout_s, "start")
        self.load_s = float(ready["load_s"])

    @property
    def pid(self) -> int:
        return self._proc.pid

    def generate(self, prompts: list[list[int]], max_tokens: int,
                 timeout_s: float = 600.0) -> dict[str, Any]:  # fmt: skip
        """Greedy outputs of ``prompts`` in one batch: ``{"results": [{"output_ids",
        "ttft_s", "num_cached_tokens"}], "wall_s"}``."""
        return self._call({"op": "generate", "prompts": prompts, "max_tokens": max_tokens},
                          timeout_s)

    def reset_prefix_cache(self) -> bool:
        """Empty vLLM's device prefix cache (the next request must come from the store)."""
        return bool(self._call({"op": "reset_prefix_cache"}, 120.0)["ok"])

    def metrics(self) -> dict[str, float]:
        """vLLM's own counters (``LLM.get_metrics``), ``name{labels}`` -> value."""
        return self._call({"op": "metrics"}, 120.0)["metrics"]

    def log_tail(self, num_lines: int = 40) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])

    def close(self) -> None:
        """Ask the engine to exit; past 60 s, kill its whole process group. Idempotent."""
        if self._proc.poll() is None:
            try:
                self._call({"op": "exit"}, 60.0)
                self._proc.wait(60.0)
            except (NodeError, OSError, subprocess.TimeoutExpired):
                pass
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        else:  # NOTE: vLLM's engine-core child shares the group; make sure it is gone too
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._log.close()

    def __enter__(self) -> VllmNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, cmd: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if self._proc.poll() is not None:
            raise NodeError(f"vLLM node {self.pid} has exited:\n{self.log_tail()}")
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(cmd) + "\n")
        self._proc.stdin.flush()
        return self._wait(timeout_s, cmd["op"])

    def _wait(self, timeout_s: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                reply = self._replies.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise NodeError(f"vLLM node {self.pid}: no answer to {what} in {timeout_s} s:"
                                f"\n{self.log_tail()}") from None
            if reply is None:
                raise NodeError(f"vLLM node {self.pid} exited during {what}:\n"
                                f"{self.log_tail()}")
            if "error" in reply:
                raise NodeError(f"vLLM node {self.pid}: {what} failed: {reply['error']}\n"
                                f"{reply.get('traceback', '')}\n{self.log_tail()}")
            return reply

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith(REPLY):
                self._replies.put(json.loads(line[len(REPLY):]))
            else:
                self._log.write(line)
        self._replies.put(None)
