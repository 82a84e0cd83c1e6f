"""One real vLLM engine (``vllm.LLM``) in its own process, driven over stdin/stdout by
``radixlink.integrations.vllm.nodes.VllmNode``: the node of the real-engine tests, the vLLM demo
and ``bench vllm``.

Owns building the engine from a JSON spec and answering commands (the protocol is
``integrations.child``'s: vLLM's own logging shares stdout and is passed over by the parent).
Run as ``python -m radixlink.integrations.vllm.node_process SPEC_JSON``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from radixlink.integrations.child import serve, start_engine


def _build(spec: dict[str, Any]) -> Any:
    from vllm import LLM

    kwargs: dict[str, Any] = {
        "model": spec["model"], "dtype": spec.get("dtype", "float32"), "seed": 0,
        "enable_prefix_caching": spec.get("prefix_caching", True),
        "max_model_len": spec.get("max_model_len", 2048), "disable_log_stats": False,
    }
    for key in ("max_num_batched_tokens", "max_num_seqs", "block_size",
                "num_gpu_blocks_override", "enforce_eager"):
        if spec.get(key) is not None:
            kwargs[key] = spec[key]
    if spec.get("kv_transfer_config") is not None:
        from vllm.config import KVTransferConfig

        kwargs["kv_transfer_config"] = KVTransferConfig(**spec["kv_transfer_config"])
    if spec.get("kv_events_config") is not None:
        from vllm.config import KVEventsConfig

        kwargs["kv_events_config"] = KVEventsConfig(**spec["kv_events_config"])
    return LLM(**kwargs)


def _generate(llm: Any, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    start = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                        use_tqdm=False)
    wall = time.perf_counter() - start
    results = []
    for out in outs:
        metrics = getattr(out, "metrics", None)
        results.append({
            "output_ids": list(out.outputs[0].token_ids),
            "ttft_s": float(getattr(metrics, "first_token_latency", 0.0) or 0.0),
            "num_cached_tokens": int(out.num_cached_tokens or 0),
        })
    return {"results": results, "wall_s": wall}


def _reset(llm: Any, attempts: int = 50) -> bool:
    """Empty vLLM's device prefix cache. NOTE: vLLM refuses while any block is in use, and
    the connector holds a finished request's blocks until its last pages are copied out, so
    this retries for a few seconds."""
    for _ in range(attempts):
        if llm.reset_prefix_cache():
            return True
        time.sleep(0.1)
    return False


def _metrics(llm: Any) -> dict[str, float]:
    """vLLM's own counters and gauges as ``name{label=value,...}`` -> value."""
    out: dict[str, float] = {}
    for metric in llm.get_metrics():
        labels = ",".join(f"{k}={v}" for k, v in sorted(metric.labels.items())
                          if k not in ("engine", "model_name"))
        name = f"{metric.name}{{{labels}}}" if labels else metric.name
        value = getattr(metric, "value", None)
        if isinstance(value, (int, float)):
            out[name] = out.get(name, 0.0) + float(value)
    return out


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    llm = start_engine(lambda: _build(spec))
    if llm is None:
        return 1
    handlers = {
        "generate": lambda cmd, llm=llm: _generate(llm, cmd["prompts"], cmd["max_tokens"]),
        "reset_prefix_cache": lambda cmd, llm=llm: {"ok": _reset(llm)},
        "metrics": lambda cmd, llm=llm: {"metrics": _metrics(llm)},
    }
    serve(handlers)
    handlers.clear()
    del llm  # NOTE: the last reference: vLLM shuts its engine core down before exit
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
