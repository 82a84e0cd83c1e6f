"""One real SGLang engine (``sglang.Engine``) in its own process, driven over stdin/stdout by
``radixlink.integrations.sglang.engines.SGLangNode``.

Owns building the engine from its ``ServerArgs`` fields and answering commands (``generate``,
``flush_cache``) through ``integrations/child.py``'s loop. Run as ``python -m
radixlink.integrations.sglang.engine_process SPEC_JSON``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
from typing import Any

from radixlink.integrations.child import reply, serve, start_engine
from radixlink.integrations.sglang.engines import STANDINS_HINT


def _served(out: dict[str, Any]) -> dict[str, Any]:
    """One request's reply record (``engines.Served``) from SGLang's output dict."""
    meta = out.get("meta_info", {})
    details = meta.get("cached_tokens_details") or {}
    finish = meta.get("finish_reason") or {}
    e2e = float(meta.get("e2e_latency") or 0.0)
    return {
        "output_ids": list(out.get("output_ids") or []),
        "finish": str(finish.get("type", "")) if isinstance(finish, dict) else str(finish),
        "ttft_s": float(meta.get("first_token_latency") or e2e),
        "e2e_s": e2e,
        "cached": int(meta.get("cached_tokens") or 0),
        "device": int(details.get("device", 0) or 0),
        "host": int(details.get("host", 0) or 0),
        "storage": int(details.get("storage", 0) or 0),
    }


async def _one(engine: Any, prompt: list[int], params: dict[str, Any]) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        return _served(await engine.async_generate(input_ids=prompt, sampling_params=params))
    except Exception as exc:  # noqa: BLE001 - SGLang's abort of this request, as a record
        if getattr(exc, "status_code", None) is None:
            raise
        return {"output_ids": [], "finish": "abort", "ttft_s": 0.0,
                "e2e_s": time.perf_counter() - start, "cached": 0, "device": 0, "host": 0,
                "storage": 0}


def main(argv: list[str]) -> int:
    if importlib.util.find_spec("sgl_kernel") is None:
        reply({"error": f"sgl_kernel is not importable. {STANDINS_HINT}", "usage": True})
        return 2
    spec = json.loads(argv[0])

    def build() -> Any:
        import sglang

        return sglang.Engine(**spec["server_args"])

    engine = start_engine(build)
    if engine is None:
        return 1

    def generate(cmd: dict[str, Any]) -> dict[str, Any]:
        """The prompts as concurrent requests (one batch for SGLang's scheduler). A request
        SGLang aborts is an ``abort`` record: the engine raises it as an HTTP error (503 when
        an external KV load failed), which would otherwise lose the batch's other answers."""
        params = {"temperature": 0.0, "max_new_tokens": int(cmd["max_tokens"])}
        start = time.perf_counter()
        outs = engine.loop.run_until_complete(asyncio.gather(
            *(_one(engine, prompt, params) for prompt in cmd["prompts"])))
        return {"results": outs, "wall_s": time.perf_counter() - start}

    def flush_cache(cmd: dict[str, Any]) -> dict[str, Any]:
        """NOTE: SGLang refuses while any request or transfer is in flight (a finished
        request's offload may still be running), so this retries for a few seconds."""
        del cmd
        for _ in range(100):
            result = engine.flush_cache()
            if getattr(result, "success", result):
                return {"ok": True}
            time.sleep(0.1)
        return {"ok": False}

    try:
        serve({"generate": generate, "flush_cache": flush_cache})
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
