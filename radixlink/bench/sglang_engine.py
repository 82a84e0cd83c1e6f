"""`radixlink bench sglang`: radixlink inside real SGLang on CPU (SmolLM2-135M fp32,
``torch_native``), its two plug points side by side in one run: ``RadixlinkLinker`` (the
unified cache external linker, on an unsealed and on a sealed store) and
``RadixlinkHiCacheStorage`` (HiCache's storage backend), against an engine with SGLang's own
device tree and no store.

Per round (a new prompt each; rounds alternate which engine goes first, ABAB): the cold run on
an empty store against no store; then each store engine empties its tree and serves the prompt
again (a store hit); then device-tree hits. Reports TTFT per case (median over rounds), the
cold-run cost, and the load rate inside the engine (the linker's and the backend's own
per-batch log lines: read + verify, and landing) against a raw batched read of the same pages
from the same store (``load_floor``). Needs .venv-sglang-cpu and the stand-ins on PYTHONPATH:
``PYTHONPATH=tests/engines/sglang_cpu/standins .venv-sglang-cpu/bin/radixlink bench sglang``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from radixlink.bench.load_floor import raw_rates
from radixlink.cmdargs import CommandParser, int_at_least

CASES = ("recompute", "linker cold", "sealed linker cold", "hicache cold", "linker store hit",
         "sealed linker store hit", "hicache store hit", "device hit", "linker device hit")
STORE_ENGINES = ("linker", "sealed linker", "hicache")
_LOAD_LINE = re.compile(r"radixlink (?:load batch \d+|hicache get): (?:(\d+) of )?(\d+) "
                        r"(?:\w+ )?pages, (\d+) bytes; read and verified in ([\d.]+) s, "
                        r"landed in ([\d.]+) s")
_STREAMED_LINE = re.compile(r"radixlink load batch \d+: (\d+) pages, (\d+) bytes; read, verified "
                            r"and landed in ([\d.]+) s \(([\d.]+) s on its thread's CPU, "
                            r"([\d.]+) s of copies")
_WAIT_LINE = re.compile(r"radixlink load batch \d+: the forward waited ([\d.]+) s on it")


def _prompts(model_dir: str, num: int, prefix_len: int) -> list[list[int]]:
    """``num`` prompts of ``prefix_len`` + 32 tokens, no two sharing a page."""
    from pydoc_data.topics import topics

    from radixlink.integrations.replay import HFTokenizer

    tok = HFTokenizer(model_dir)
    names = sorted(topics)
    out = []
    for i in range(num):
        ids = tok.encode(f"Document {i}.\n" + "\n\n".join(topics[n] for n in names[i::num]))
        assert len(ids) >= prefix_len + 32, "not enough text"
        out.append(ids[: prefix_len + 32])
    return out


def _loads(log: str) -> dict[str, float]:
    """Pages, payload bytes and seconds of every store load an engine's log reports. A
    streamed load (CPU pools) lands while it reads: its copies count as landing, the rest of
    its time as read and verify, so the two add up to its wall time; its thread's CPU time
    is ``cpu_s``. ``waited_s``: how long the forward waited on the loads (the linker's)."""
    pages = nbytes = read_s = land_s = streamed = cpu_s = 0.0
    for match in _LOAD_LINE.finditer(log):
        good, total, size, read, land = match.groups()
        pages += float(good if good is not None else total)
        nbytes += float(size)
        read_s += float(read)
        land_s += float(land)
    for match in _STREAMED_LINE.finditer(log):
        total, size, wall, cpu, copies = match.groups()
        pages += float(total)
        nbytes += float(size)
        read_s += float(wall) - float(copies)
        land_s += float(copies)
        cpu_s += float(cpu)
        streamed += 1
    waits = [float(m.group(1)) for m in _WAIT_LINE.finditer(log)]
    return {"pages": pages, "bytes": nbytes, "read_s": read_s, "land_s": land_s,
            "streamed": streamed, "cpu_s": cpu_s, "waited_s": sum(waits), "waits": len(waits)}


def _round(nodes: dict[str, Any], prompt: list[int], new_tokens: int, flip: bool,
           ttft: dict[str, list[float]], outs: set[tuple[int, ...]]) -> None:  # fmt: skip
    """One prompt through every case; ``flip`` reverses the order of the engines."""

    def serve(name: str, case: str, source: str | None = None) -> None:
        served = nodes[name].generate([prompt], new_tokens)[0]
        assert not served.aborted, f"{case}: SGLang aborted the request"
        if source is not None:
            assert getattr(served, source) > 0, f"{case}: nothing came from the {source} counter"
        ttft[case].append(served.ttft_s)
        outs.add(tuple(served.output_ids))

    order = (["plain", "linker", "sealed linker", "hicache"])[:: -1 if flip else 1]
    for name in order:
        serve(name, "recompute" if name == "plain" else f"{name} cold")
    for name in order:
        if name != "plain":
            assert nodes[name].flush_cache(), f"{name}: SGLang did not empty its tree"
            time.sleep(0.5)  # NOTE: lets the last offload reach the store before the lookup
            serve(name, f"{name} store hit", "storage" if name == "hicache" else "host")
    for name in order[::-1]:
        if name in ("plain", "linker"):
            serve(name, "device hit" if name == "plain" else "linker device hit", "device")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from radixlink.engine.hf_export import export
    from radixlink.integrations.sglang.engines import CacheMode, EngineSpec, start_side_by_side

    model = str(export("smollm2-135m"))
    tmp = Path(tempfile.mkdtemp(prefix="radixlink-bench-sglang-"))
    secret = tmp / "load-secret"
    secret.write_text(secrets.token_hex(32))
    secret.chmod(0o600)
    stores = {"linker": f"file://{tmp}/linker", "sealed linker": f"file://{tmp}/sealed?auth=file:"
              f"{secret}", "hicache": f"file://{tmp}/hicache"}
    prompts = _prompts(model, args.rounds + 1, args.prefix_tokens)
    load_before = os.getloadavg()
    specs = {"plain": EngineSpec(model=model, cache=CacheMode.DEVICE),
             "linker": EngineSpec(model=model, cache=CacheMode.LINKER, store=stores["linker"],
                                  log_level="info"),
             "sealed linker": EngineSpec(model=model, cache=CacheMode.LINKER,
                                         store=stores["sealed linker"], log_level="info"),
             "hicache": EngineSpec(model=model, cache=CacheMode.HICACHE,
                                   store=stores["hicache"], log_level="info")}
    ttft: dict[str, list[float]] = {case: [] for case in CASES}
    nodes: dict[str, Any] = {}
    try:
        started = start_side_by_side(list(specs.values()),
                                     [tmp / f"{name}.log" for name in specs])
        nodes = dict(zip(specs, started, strict=True))
        warm: dict[str, list[float]] = {case: [] for case in CASES}
        _round(nodes, prompts[0], args.new_tokens, False, warm, set())  # NOTE: warm-up
        logs_before = {n: len(nodes[n].log_tail(10**7)) for n in STORE_ENGINES}
        identical = True
        for r, prompt in enumerate(prompts[1:]):
            outs: set[tuple[int, ...]] = set()
            _round(nodes, prompt, args.new_tokens, r % 2 == 1, ttft, outs)
            identical &= len(outs) == 1
        loads = {n: _loads(nodes[n].log_tail(10**7)[logs_before[n]:]) for n in STORE_ENGINES}
        layers = json.loads((Path(model) / "config.json").read_text())["num_hidden_layers"]
        raw = {n: raw_rates(url, pieces=2 * layers) for n, url in stores.items()}
    finally:
        for node in nodes.values():
            node.close()
        shutil.rmtree(tmp, ignore_errors=True)
    med = {case: statistics.median(v) for case, v in ttft.items()}
    load = {n: _rates(loads[n], raw[n]) for n in loads}
    return {
        "model": "smollm2-135m fp32 (SGLang 0.5.23, CPU, torch_native)",
        "prompt_tokens": args.prefix_tokens + 32, "rounds": args.rounds,
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "outputs_identical_across_cases": identical,
        "rows": [{"case": case, "requests": len(ttft[case]),
                  "TTFT p50 s": round(med[case], 4),
                  "TTFT min s": round(min(ttft[case]), 4)} for case in CASES],
        "store_hit_vs_recompute_ttft": {p: round(med["recompute"] / med[f"{p} store hit"], 2)
                                        for p in STORE_ENGINES},
        "store_hit_vs_device_hit_ttft": {p: round(med[f"{p} store hit"] / med["device hit"], 2)
                                         for p in STORE_ENGINES},
        "cold_vs_no_store_ttft": {p: round(med[f"{p} cold"] / med["recompute"], 3)
                                  for p in STORE_ENGINES},
        "load": load,
        "sealed_vs_unsealed_load": round(load["sealed linker"]["read_verify_land_GBps"]
                                         / load["linker"]["read_verify_land_GBps"], 3),
    }


def _rates(load: dict[str, float], raw: dict[str, Any]) -> dict[str, Any]:
    gbps = (lambda b, s: round(b / s / 1e9, 3) if s > 0 else 0.0)  # noqa: E731
    landed = gbps(load["bytes"], load["read_s"] + load["land_s"])
    return {"pages": load["pages"], "MB": round(load["bytes"] / 1e6, 2),
            "streamed_loads": int(load["streamed"]),
            "read_verify_GBps": None if load["streamed"] else gbps(load["bytes"], load["read_s"]),
            "read_verify_land_GBps": landed, "raw_read_GBps": raw["read_GBps"],
            "memcpy_GBps": raw["memcpy_GBps"], "one_core": raw["one_core"],
            "read_beside_memcpy_GBps": raw["read_beside_memcpy_GBps"],
            "vs_raw_read": round(landed / raw["read_GBps"], 3),
            "vs_in_layout_bound": (round(landed / raw["one_core"]["direct_in_layout_GBps"], 3)
                                   if raw["one_core"]["direct_in_layout_GBps"] else None),
            # NOTE: a streamed load's thread on the CPU, and how long the forward waited on
            # the loads: the rest of a load overlapped the scheduler preparing its batch
            "cpu_GBps": gbps(load["bytes"], load["cpu_s"]) if load["streamed"] else None,
            "on_cpu_share": (round(load["cpu_s"] / (load["read_s"] + load["land_s"]), 3)
                             if load["streamed"] else None),
            "forward_waited_ms_per_load": (round(load["waited_s"] / load["waits"] * 1e3, 2)
                                           if load["waits"] else None),
            "forward_wait_share": (round(load["waited_s"] / (load["read_s"] + load["land_s"]), 3)
                                   if load["waits"] else None)}


def _read_verify(load: dict[str, Any]) -> str:
    if load["read_verify_GBps"] is None:
        return "n/a read+verify (landed chunk by chunk while read)"
    return f"{load['read_verify_GBps']} GB/s read+verify"


def main(argv: list[str]) -> int:
    p = CommandParser(prog="radixlink bench sglang", description=__doc__)
    p.add_argument("--rounds", type=int_at_least(3), default=3,
                   help="prompts, one per round (ABAB order; medians over rounds)")
    p.add_argument("--prefix-tokens", type=int_at_least(128), default=1000)
    p.add_argument("--new-tokens", type=int_at_least(1), default=8)
    p.add_argument("--json", default="bench/results/sglang.json", help="write the results here")
    args = p.parse_args(argv)
    from radixlink.integrations.sglang.demo import missing

    why = missing()
    if why is not None:
        raise ImportError(why.replace("radixlink demo --engine sglang", "radixlink bench sglang"))
    result = run(args)
    from radixlink.engine.demo import print_table

    print_table(f"bench sglang: {result['model']}, prompts of {result['prompt_tokens']} tokens, "
                f"{result['rounds']} rounds (load average before/after "
                f"{result['load_average_before_after']})", result["rows"])
    for p_name in STORE_ENGINES:
        load = result["load"][p_name]
        print(f"{p_name}: store hit TTFT {result['store_hit_vs_recompute_ttft'][p_name]}x lower "
              f"than recompute, {result['store_hit_vs_device_hit_ttft'][p_name]}x a device hit; "
              f"cold run {result['cold_vs_no_store_ttft'][p_name]}x the TTFT without a store; "
              f"loads {load['MB']} MB at {_read_verify(load)}, "
              f"{load['read_verify_land_GBps']} GB/s with landing ({load['vs_raw_read']}x a raw "
              f"read of the same store, {load['raw_read_GBps']} GB/s; memcpy "
              f"{load['memcpy_GBps']} GB/s; read, check and copy each alone on one core: "
              f"{load['one_core']['bound_GBps']} GB/s; overlapped on two: "
              f"{load['one_core']['two_core_bound_GBps']} GB/s; read and check alone, read "
              f"straight into the pools: {load['one_core']['direct_bound_GBps']} GB/s on one "
              f"core, {load['one_core']['direct_two_core_bound_GBps']} GB/s on two, "
              f"{load['one_core']['direct_in_cache_GBps']} GB/s on one with each page "
              f"checked as it is read (in cache), "
              f"{load['one_core']['direct_in_layout_GBps']} GB/s so with each page in the "
              f"pools' layout (a run of rows in each layer's K and V); the read "
              f"beside a memcpy on the other core: {load['read_beside_memcpy_GBps']} GB/s)")
        if load["forward_waited_ms_per_load"] is not None:
            print(f"  {p_name}: the load's thread on the CPU {load['on_cpu_share']} of its wall "
                  f"({load['cpu_GBps']} GB/s of CPU time); the forward waited "
                  f"{load['forward_waited_ms_per_load']} ms a load, {load['forward_wait_share']} "
                  f"of the load's wall (the rest overlapped the scheduler preparing the batch)")
    print(f"sealed / unsealed linker load inside the engine: "
          f"{result['sealed_vs_unsealed_load']}x")
    print(f"outputs identical across cases: {result['outputs_identical_across_cases']}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0
