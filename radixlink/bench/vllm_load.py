"""The load rate inside real vLLM (part of ``radixlink bench vllm``): one long prompt saved to a
``file://`` store, then restored by a fresh engine, with the worker's per-batch log lines (read
and verify, the wait for the model runner, the scatter) against a raw read and a memcpy of the
same bytes, for an unsealed and a sealed (keyed BLAKE3) store, side by side in one run.

Owns this measurement. The nodes are ``integrations.vllm.nodes``'; the TTFTs are vLLM's.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from radixlink.bench.load_floor import raw_rates

LINE = re.compile(r"radixlink load batch: (\d+) pages, (\d+) bytes; read and verified in "
                  r"([\d.]+) s \(([\d.]+) s of copies into the blocks during it\), waited "
                  r"([\d.]+) s for the model runner, scattered in ([\d.]+) s")
_LOGGING = {  # NOTE: vLLM applies it in every process it starts (VLLM_LOGGING_CONFIG_PATH)
    "version": 1, "disable_existing_loggers": False, "formatters": {},
    "handlers": {"out": {"class": "logging.StreamHandler", "stream": "ext://sys.stdout"}},
    "loggers": {"radixlink": {"handlers": ["out"], "level": "INFO", "propagate": False}},
}


def batches(log: str) -> list[dict[str, float]]:
    """The worker's load-batch lines of a node's log, in order."""
    return [{"pages": int(m[1]), "bytes": int(m[2]), "read_s": float(m[3]),
             "landed_s": float(m[4]), "wait_s": float(m[5]), "scatter_s": float(m[6])}
            for m in LINE.finditer(log)]


def run(model: str, tmp: Path, prompt: list[int], new_tokens: int,
        served: Callable[..., tuple[float, float, float, list[int]]],
        warm_loads: int = 3) -> dict[str, Any]:
    """For an unsealed and a sealed store: a node saves ``prompt``; a fresh node serves it
    from the store (its first load), then from its device cache, then from the store again
    ``warm_loads`` times (a warm process's loads; the row's warm load is their median, by
    rate). ``served`` is ``vllm_engine._served``."""
    from radixlink.integrations.vllm.nodes import NodeSpec, VllmNode, connector_config

    logging_config = tmp / "load-logging.json"
    logging_config.write_text(json.dumps(_LOGGING))
    secret = tmp / "load-secret"
    secret.write_text(secrets.token_hex(32))
    secret.chmod(0o600)
    limits = {"max_model_len": len(prompt) + 256, "max_num_batched_tokens": len(prompt) + 256,
              "kv_cache_gib": 2, "env": {"VLLM_LOGGING_CONFIG_PATH": str(logging_config)}}
    out: dict[str, Any] = {"prompt_tokens": len(prompt), "warm_loads": warm_loads,
                           "cases": {}}
    for case, query in (("unsealed", ""), ("sealed", f"?auth=file:{secret}")):
        url = f"file://{tmp}/load-{case}{query}"
        spec = NodeSpec(model=model, kv_transfer_config=connector_config(url), **limits)
        with VllmNode(spec, tmp / f"load-{case}-writer.log") as writer:
            served(writer, prompt, new_tokens)
        with VllmNode(spec, tmp / f"load-{case}-reader.log") as reader:
            served(reader, [7, 8, 9] * 20, 2)  # NOTE: one-time setup, no page of the prompt
            first = served(reader, prompt, new_tokens)
            device = served(reader, prompt, new_tokens)
            again = []
            for _ in range(warm_loads):
                assert reader.reset_prefix_cache(), "vLLM did not empty its prefix cache"
                again.append(served(reader, prompt, new_tokens))
        lines = batches(reader.log_path.read_text())  # NOTE: complete once the node stopped
        assert len(lines) == 1 + warm_loads, (
            f"{case}: expected {1 + warm_loads} load batches, got {lines}")
        row: dict[str, Any] = {"MB": round(lines[0]["bytes"] / 1e6, 1), "identical": all(
            out[3] == first[3] for out in (device, *again))}
        loads = [load_row(line, ttft, device[1]) for line, ttft in
                 zip(lines, [first[1]] + [out[1] for out in again], strict=True)]
        row["first load"] = loads[0]
        row["warm load"] = median_load(loads[1:])
        row["warm loads GBps"] = [load["GBps"] for load in loads[1:]]
        layers = json.loads((Path(model) / "config.json").read_text())["num_hidden_layers"]
        row.update(raw_rates(url, pieces=layers))  # NOTE: a block: one run in each layer
        out["cases"][case] = row
    unsealed, sealed = out["cases"]["unsealed"], out["cases"]["sealed"]
    out["warm_load_vs_raw_read"] = round(unsealed["warm load"]["GBps"] / unsealed["read_GBps"],
                                         3)
    out["warm_load_vs_one_core_bound"] = {
        case: round(row["warm load"]["GBps"] / row["one_core"]["bound_GBps"], 3)
        for case, row in out["cases"].items()}
    # NOTE: a load read straight into the blocks makes two passes (read, check), not three
    out["warm_load_vs_two_pass_bound"] = {
        case: round(row["warm load"]["GBps"] / row["one_core"]["direct_bound_GBps"], 3)
        for case, row in out["cases"].items()}
    # NOTE: page by page, the check finds each page in cache (as a load's does)
    out["warm_load_vs_in_cache_bound"] = {
        case: round(row["warm load"]["GBps"] / row["one_core"]["direct_in_cache_GBps"], 3)
        for case, row in out["cases"].items()}
    # NOTE: and read into one run per layer, checked run by run as a load reads and checks
    out["warm_load_vs_in_layout_bound"] = {
        case: round(row["warm load"]["GBps"] / row["one_core"]["direct_in_layout_GBps"], 3)
        for case, row in out["cases"].items()}
    out["sealed_vs_unsealed"] = round(sealed["warm load"]["GBps"]
                                      / unsealed["warm load"]["GBps"], 3)
    return out


def median_load(loads: list[dict[str, Any]]) -> dict[str, Any]:
    """The load of median rate (the slower middle one of an even count). NOTE: one load swings
    by more than the changes it measures (5.2-7.3 GB/s at one commit), hence several."""
    return sorted(loads, key=lambda load: load["GBps"])[(len(loads) - 1) // 2]


def load_row(line: dict[str, float], ttft: float, device_ttft: float) -> dict[str, Any]:
    """One load's times and rate from its batch line, and its TTFT over a device hit's."""
    total = line["read_s"] + line["wait_s"] + line["scatter_s"]
    return {"read_verify_s": line["read_s"], "landed_during_s": line["landed_s"],
            "wait_s": line["wait_s"], "scatter_s": line["scatter_s"],
            "GBps": round(line["bytes"] / total / 1e9, 2), "ttft_s": round(ttft, 4),
            "ttft_over_device_hit_s": round(ttft - device_ttft, 4)}


def print_rows(result: dict[str, Any]) -> None:
    """The load section of ``bench vllm``'s output."""
    from radixlink.engine.demo import print_table

    rows = []
    for case, row in result["cases"].items():
        for name in ("first load", "warm load"):
            load = row[name]
            rows.append({"store": case, "load": name, "MB": row["MB"],
                         "read+verify(+land) s": load["read_verify_s"],
                         "of it landing s": load["landed_during_s"], "wait s": load["wait_s"],
                         "scatter s": load["scatter_s"], "in-engine GB/s": load["GBps"],
                         "raw read GB/s": row["read_GBps"], "memcpy GB/s": row["memcpy_GBps"],
                         "1-core read+check+copy GB/s": row["one_core"]["bound_GBps"],
                         "1-core read+check GB/s": row["one_core"]["direct_bound_GBps"],
                         "1-core read+check in cache GB/s":
                             row["one_core"]["direct_in_cache_GBps"],
                         "1-core read+check in layout GB/s":
                             row["one_core"]["direct_in_layout_GBps"],
                         "TTFT over device hit s": load["ttft_over_device_hit_s"],
                         "identical": row["identical"]})
    print_table(f"load inside vLLM: one prompt of {result['prompt_tokens']} tokens, a fresh "
                f"engine's first load and a warm one (the median of {result['warm_loads']}), "
                "against a raw read and a memcpy of the same bytes", rows)
    bound, two = result["warm_load_vs_one_core_bound"], result["warm_load_vs_two_pass_bound"]
    cache, layout = result["warm_load_vs_in_cache_bound"], result["warm_load_vs_in_layout_bound"]
    print(f"warm in-engine load / raw read: {result['warm_load_vs_raw_read']:.3f}x; sealed / "
          f"unsealed in-engine load: {result['sealed_vs_unsealed']:.3f}x; warm load / the "
          f"one-core bound of three passes (through staging): unsealed {bound['unsealed']:.3f}x,"
          f" sealed {bound['sealed']:.3f}x; of two (read straight into the blocks): unsealed "
          f"{two['unsealed']:.3f}x, sealed {two['sealed']:.3f}x; of two, each page checked "
          f"as it is read (in cache): unsealed {cache['unsealed']:.3f}x, sealed "
          f"{cache['sealed']:.3f}x; so, into one run per layer as the load reads and checks "
          f"it: unsealed {layout['unsealed']:.3f}x, sealed {layout['sealed']:.3f}x")
    for case, row in result["cases"].items():
        one = row["one_core"]
        print(f"  {case}, one core: read {one['read_GBps']} GB/s, check {one['check_GBps']} "
              f"GB/s, copy into 4 KiB-paged memory {one['copy_GBps']} GB/s; the warm loads "
              f"GB/s: {row['warm loads GBps']}")
