"""Real SGLang 0.5.23 engines on CPU as child processes (``engine_process``), each started
fresh, driven by command and stopped by PID: the engines of the real-engine tests,
``demo --engine sglang`` and ``bench sglang``.

Owns the engine spec, the flags SGLang on CPU needs (one dict for ``sglang.Engine`` and for
``python -m sglang.launch_server``), the process environment and the reply records. Must not
decide what runs on the engines. SGLang's CPU path imports ``sgl_kernel`` (not on PyPI) and
``torchvision``; the caller's environment provides them (the test suite's stand-ins on
``PYTHONPATH``, see docs/integrations.md "SGLang on CPU"); this module never imports them.
"""

from __future__ import annotations

import enum
import json
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixlink.integrations.child import ChildProcess

LINKER_MODULE = "radixlink.integrations.sglang.linker"
HICACHE_MODULE = "radixlink.integrations.sglang.hicache"
STANDINS_HINT = (
    "SGLang on CPU imports sgl_kernel, whose CPU build is not on PyPI: put the stand-ins on "
    "PYTHONPATH (PYTHONPATH=tests/engines/sglang_cpu/standins, as `make demo-sglang` and "
    "`make test` do; see docs/integrations.md 'SGLang on CPU')"
)


class CacheMode(enum.Enum):
    """What an engine caches: nothing, its own device tree, or that tree linked to a store."""

    OFF = "off"  # --disable-radix-cache: every token recomputed (the reference)
    DEVICE = "device"  # SGLang's own radix cache, no store
    LINKER = "linker"  # + RadixlinkLinker (unified cache external linker, no host tier)
    HICACHE = "hicache"  # + HiCache with RadixlinkHiCacheStorage under its host tier


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSpec:
    """One SGLang engine on CPU.

    Attributes:
        model: a Hugging Face model directory (``hf_export.export``).
        cache: ``CacheMode``.
        store: the store URL (``LINKER`` and ``HICACHE``).
        page_size: tokens per page (SGLang's and the store's).
        max_total_tokens: the device KV pool in tokens. NOTE: on CPU SGLang sizes the pool as
            a fraction of host RAM (``--mem-fraction-static``); this bound keeps it small.
        context_length: the longest request (also sizes SGLang's request-to-token table).
        max_running_requests: requests in one batch.
        hicache_ratio: the HiCache host pool, in device pools.
        log_level: SGLang's; ``info`` adds the linker's per-batch load lines.
        extra: more ``ServerArgs`` fields, by name.
        env: more environment variables for the process.
    """

    model: str
    cache: CacheMode = CacheMode.OFF
    store: str | None = None
    page_size: int = 16
    max_total_tokens: int = 8192
    context_length: int = 4096
    max_running_requests: int = 16
    hicache_ratio: float = 2.0
    log_level: str = "warning"
    extra: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.cache in (CacheMode.LINKER, CacheMode.HICACHE)) != (self.store is not None):
            raise ValueError(f"EngineSpec: cache={self.cache.value} with store={self.store!r}; "
                             "a store URL goes with cache=linker or cache=hicache only")
        for name in ("page_size", "max_total_tokens", "context_length", "max_running_requests"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"EngineSpec: {name}={getattr(self, name)!r}; expected a "
                                 "positive int")
        if self.max_total_tokens < self.page_size:
            raise ValueError(f"EngineSpec: max_total_tokens={self.max_total_tokens} holds no "
                             f"page of {self.page_size} tokens; raise it")


def server_args(spec: EngineSpec) -> dict[str, Any]:
    """The ``ServerArgs`` fields of ``spec`` (keyword arguments of ``sglang.Engine``).

    NOTE: ``torch_native`` because the x86 default (``intel_amx``) needs SGLang's CPU kernel
    build; fp32 keeps greedy outputs independent of how a prefix was computed (cached, loaded
    or recomputed); HiCache runs ``layer_first`` with ``direct`` I/O (the one CPU copy path
    the stand-ins cover), waits for every prefetch (``wait_complete``), so a store hit is
    never cut short by a timeout, and prefetches any whole page (``prefetch_threshold``, 256
    tokens by default), as the linker loads any. ``sleep_on_idle``: an idle scheduler polls
    its sockets in a busy loop otherwise, a whole core per engine, which on a small machine
    the busy engine then shares.
    """
    args: dict[str, Any] = {
        "model_path": spec.model, "device": "cpu", "attention_backend": "torch_native",
        "disable_cuda_graph": True, "dtype": "float32", "page_size": spec.page_size,
        "max_total_tokens": spec.max_total_tokens, "mem_fraction_static": 0.5,
        "context_length": spec.context_length,
        "max_running_requests": spec.max_running_requests, "random_seed": 0,
        "enable_metrics": True, "log_level": spec.log_level, "sleep_on_idle": True,
    }
    if spec.cache is CacheMode.OFF:
        args["disable_radix_cache"] = True
    elif spec.cache is CacheMode.LINKER:
        args.update(
            enable_unified_cache_external_linker=True,
            unified_cache_external_linker_backend="dynamic",
            unified_cache_external_linker_config={
                "linker": "RadixlinkLinker", "linker_module_path": LINKER_MODULE,
                "linker_extra_config": {"store": spec.store}})
    elif spec.cache is CacheMode.HICACHE:
        args.update(
            enable_hierarchical_cache=True, hicache_ratio=spec.hicache_ratio,
            hicache_mem_layout="layer_first", hicache_io_backend="direct",
            hicache_storage_prefetch_policy="wait_complete", hicache_storage_backend="dynamic",
            hicache_storage_backend_extra_config=json.dumps({
                "backend_name": "radixlink", "module_path": HICACHE_MODULE,
                "class_name": "RadixlinkHiCacheStorage", "interface_v1": 1,
                "store": spec.store, "prefetch_threshold": spec.page_size}))
    return {**args, **spec.extra}


def launch_args(spec: EngineSpec) -> list[str]:
    """``server_args(spec)`` as ``python -m sglang.launch_server`` flags."""
    out: list[str] = []
    for name, value in server_args(spec).items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is not False and value is not None:
            out += [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return out


def engine_env(spec: EngineSpec) -> dict[str, str]:
    """The environment of an SGLang process on CPU (the caller's, PYTHONPATH included).

    NOTE: ``SGLANG_USE_CPU_ENGINE=1``: without it ``--device cpu`` still takes GPU paths.
    SGLang's page hash is a torch C++ extension built on first use; it goes into the venv
    (``scripts/setup_sglang_cpu_venv.sh`` builds it there), so engines never build it, nor
    race each other doing so. ``SGLANG_RUST_BUILD_MODE=never``: the tree core's bundled build.
    """
    return {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "SGLANG_RUST_BUILD_MODE": os.environ.get("SGLANG_RUST_BUILD_MODE", "never"),
            "TORCH_EXTENSIONS_DIR": os.environ.get(
                "TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch-extensions")),
            **spec.env}


@dataclass(frozen=True, slots=True, kw_only=True)
class Served:
    """One request's outputs and where SGLang says its prompt tokens came from.

    Attributes:
        output_ids: the generated tokens (empty when SGLang aborted the request).
        finish: SGLang's finish reason type (``length``, ``stop``, ``abort``).
        ttft_s: time to first token (SGLang's ``first_token_latency``).
        e2e_s: the request's whole time.
        cached: prompt tokens not computed (SGLang's ``cached_tokens``).
        device, host, storage: ``cached_tokens_details``: from the device tree; from the host
            tier, which is where the external linker's store hits are counted; from HiCache's
            storage backend.
    """

    output_ids: list[int]
    finish: str
    ttft_s: float
    e2e_s: float
    cached: int
    device: int
    host: int
    storage: int

    @property
    def aborted(self) -> bool:
        return self.finish == "abort"

    @property
    def from_store(self) -> int:
        """Prompt tokens loaded from the store, by either plug point."""
        return self.host + self.storage

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> Served:
        return cls(**reply)


class SGLangNode:
    """A started SGLang engine (``sglang.Engine``) in its own process. Use as a context
    manager; ``close`` stops it and its scheduler processes by PID.

    Args:
        spec: what to build.
        log_path: where the process's output goes (its tail is in every error).
        python: the interpreter (default: this one; it must have SGLang).
        start_timeout_s: how long the engine may take to start.

    Raises:
        NodeError: the engine did not start (one line when ``sgl_kernel`` is not importable).
    """

    def __init__(self, spec: EngineSpec, log_path: str | Path, *, python: str | None = None,
                 start_timeout_s: float = 600.0):  # fmt: skip
        self.spec = spec
        payload = json.dumps({"server_args": server_args(spec)})
        self._child = ChildProcess("radixlink.integrations.sglang.engine_process", payload,
                                   log_path, env=engine_env(spec), python=python,
                                   start_timeout_s=start_timeout_s, what="SGLang engine")
        self.load_s = float(self._child.ready["load_s"])

    @property
    def pid(self) -> int:
        return self._child.pid

    def generate(self, prompts: list[list[int]], max_tokens: int,
                 timeout_s: float = 900.0) -> list[Served]:  # fmt: skip
        """Greedy outputs of ``prompts``, sent as one batch."""
        got = self._child.call({"op": "generate", "prompts": prompts, "max_tokens": max_tokens},
                               timeout_s)
        return [Served.from_reply(r) for r in got["results"]]

    def flush_cache(self) -> bool:
        """Empty SGLang's device tree (and HiCache's host tier): the next request looks up the
        store. False when SGLang refused (requests in flight)."""
        return bool(self._child.call({"op": "flush_cache"}, 120.0)["ok"])

    def log_tail(self, num_lines: int = 40) -> str:
        return self._child.log_tail(num_lines)

    def close(self) -> None:
        self._child.close()

    def __enter__(self) -> SGLangNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_side_by_side(specs: Sequence[EngineSpec], log_paths: Sequence[Path]) -> list[SGLangNode]:
    """Start an engine per spec, all at once (a start is 40-70 s on a small CPU machine, mostly
    imports, so side by side saves most of it); if one fails, the others are stopped and its
    error raised."""
    with ThreadPoolExecutor(max(1, len(specs))) as pool:
        futures = [pool.submit(SGLangNode, spec, path)
                   for spec, path in zip(specs, log_paths, strict=True)]
    started = [f.result() for f in futures if f.exception() is None]
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        for node in started:
            node.close()
        raise failed[0]  # type: ignore[misc]
    return started

