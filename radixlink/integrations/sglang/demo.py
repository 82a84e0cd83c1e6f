"""`radixlink demo --engine sglang`: the reference demo's conversation workload on real SGLang
engines on CPU (SmolLM2-135M in fp32) that share one store through ``RadixlinkLinker``, then
the same workload on an engine with caching off; every generated token is compared.

Owns the SGLang run of the demo: its engines (``engines.py``) and per-request accounting from
SGLang's own counters (``cached_tokens_details``: device tree, and ``host``, where SGLang
counts the linker's store hits). A request SGLang aborts (a load batch that failed
verification: only under ``--faults``) is retried, as a client would. The replay, tables and
report are ``integrations/replay.py``'s, shared with ``demo --engine vllm``.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import time
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

RETRIES = 2  # NOTE: a retry restores the longest good prefix (bad pages read absent)


def _serve(node: Any, prompts: list[list[int]], max_new: int) -> list[Turn]:
    """One request at a time (each request's counters are then its own); an aborted request
    is sent again, up to ``RETRIES`` times, and counted."""
    turns = []
    for prompt in prompts:
        served = node.generate([prompt], max_new)[0]
        retries = 0
        while served.aborted and retries < RETRIES:
            retries += 1
            served = node.generate([prompt], max_new)[0]
        turns.append(Turn(node=-1, prompt_ids=prompt, output_ids=served.output_ids,
                          ttft_s=served.ttft_s, tokens={
                              "device": served.device, "store": served.from_store,
                              "computed": len(prompt) - served.cached, "retries": retries}))
    return turns


def run(args: argparse.Namespace) -> int:
    """The demo on SGLang; ``args`` are the reference demo's (``radixlink demo --help``)."""
    from radixlink.engine.hf_export import export
    from radixlink.integrations.sglang.engines import (
        CacheMode,
        EngineSpec,
        start_side_by_side,
    )

    model_dir = str(export("smollm2-135m"))
    start = time.perf_counter()
    tmp, urls, spec = demo_setup(args, "sglang")
    print(f"radixlink demo --engine sglang: {args.nodes} SGLang engines (CPU, torch_native, "
          f"smollm2-135m, fp32, RadixlinkLinker), store {urls[0]}")
    print(workload_line(args, "engine"))
    specs = [EngineSpec(model=model_dir, cache=CacheMode.LINKER, store=url,
                        page_size=args.page_size) for url in urls]
    specs.append(EngineSpec(model=model_dir, page_size=args.page_size))
    nodes: list[Any] = []
    try:
        nodes = start_side_by_side(specs, [Path(tmp) / f"engine{i}.log"
                                           for i in range(len(specs))])
        print("engine start: " + ", ".join(f"{n.load_s:.1f} s" for n in nodes))
        for node in nodes:  # NOTE: warm-up (first calls pay one-time setup); under a page
            node.generate([list(range(1000, 1000 + args.page_size // 2))], 2)
        tok = HFTokenizer(model_dir)
        on = replay(nodes[:-1], tok, spec, args.max_new_tokens, args.nodes, _serve)
        off = replay(nodes[-1:], tok, spec, args.max_new_tokens, args.nodes, _serve)
        print(f"demo wall time {time.perf_counter() - start:.1f} s")
        print_replies(on, tok, args.turns)
        retried = sum(t.tokens["retries"] > 0 for t in on.values())
        if retried:
            print(f"requests SGLang aborted (a load batch failed verification) and that "
                  f"were sent again: {retried}")
        return report(on, off, args.nodes)
    finally:
        for node in nodes:
            node.close()
        shutil.rmtree(tmp, ignore_errors=True)


def missing() -> str | None:
    """Why the SGLang demo cannot run here (None: it can)."""
    if importlib.util.find_spec("sglang") is None or importlib.util.find_spec("uvloop") is None:
        return ("radixlink demo --engine sglang needs real SGLang for CPU: run `make "
                "demo-sglang` (bash scripts/setup_sglang_cpu_venv.sh builds .venv-sglang-cpu)")
    if importlib.util.find_spec("sgl_kernel") is None:
        from radixlink.integrations.sglang.engines import STANDINS_HINT

        return f"sgl_kernel is not importable. {STANDINS_HINT}"
    return None


if __name__ == "__main__":
    sys.exit("run it as: radixlink demo --engine sglang")
