"""One real vLLM engine (``vllm.LLM``) in its own process, driven over stdin/stdout by
``radixlink.integrations.vllm.nodes.VllmNode``: the node of the real-engine tests, the vLLM demo
and ``bench vllm``.

Owns building the engine from a JSON spec and answering commands. Every reply is one stdout line
that starts with ``REPLY``; vLLM's own logging shares stdout and is passed over by the parent.
Run as ``python -m radixlink.integrations.vllm.node_process SPEC_JSON``.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any

REPLY = "@@radixlink-node "


def _reply(payload: dict[str, Any]) -> None:
    sys.stdout.write(REPLY + json.dumps(payload) + "\n")
    sys.stdout.flush()


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
    start = time.perf_counter()
    try:
        llm = _build(spec)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
        _reply({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        return 1
    _reply({"ready": True, "load_s": time.perf_counter() - start})
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            op = cmd["op"]
            if op == "generate":
                _reply(_generate(llm, cmd["prompts"], cmd["max_tokens"]))
            elif op == "reset_prefix_cache":
                _reply({"ok": _reset(llm)})
            elif op == "metrics":
                _reply({"metrics": _metrics(llm)})
            elif op == "exit":
                _reply({"ok": True})
                break
            else:
                _reply({"error": f"unknown op {op!r}"})
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
            _reply({"error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()})
    del llm
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
