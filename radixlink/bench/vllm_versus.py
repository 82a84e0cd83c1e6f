"""The first store hit inside real vLLM, radixlink's connector against vLLM's own
``ExampleConnector`` (safetensors files per request and layer, loaded in the worker), in one
run on the same workload and the same kind of store (a directory on the same filesystem).

Per connector: a writer engine serves ``groups`` groups of prompts sharing a prefix (the
saves), then stops. Then ``rounds`` times: a fresh reader engine per connector, on its
writer's store, serves the first prompt of each group (a store hit with a cold device cache:
that group's first store hit; the first group's is the first store hit of a fresh process)
and then the others, and stops. The two writers run side by side, then each round's two
readers, requests alternating which connector goes first (for the first hits: by group and
by round, so each connector serves a fresh process's first hit first in every other round),
each reader request after ``IDLE_S`` of quiet. Outputs are checked against the writer's
(greedy, fp32). Readers run the connectors' timed twins (``vllm_hooks``): from a request's
arrival to the first forward that computes it is the connector's share of a first hit.

Owns this part of `radixlink bench vllm`; the engines are ``nodes.VllmNode``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXAMPLE = "ExampleConnector"
HOOKS = "radixlink.bench.vllm_hooks"
HOOK_LOG_ENV = "RADIXLINK_BENCH_HOOK_LOG"
IDLE_S = 1.5
"""The pause before each timed request: vLLM's worker spins on its shared-memory queue for 1 s
after its last message (``shm_broadcast``'s ``busy_loop_s``), and both engines' workers are
bound to the same core here, so a request sent right after the other engine's ran against that
spin: first hits took 0.5 s or 0.05 s by that alone, for either connector."""


def _store_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def _forward_starts(path: Path) -> list[float]:
    """The wall-clock starts of a reader's forwards so far (``vllm_hooks``)."""
    if not path.exists():
        return []
    return [float(line) for line in path.read_text().split()]


def run(model: str, tmp: Path, prompts: list[list[list[int]]], new_tokens: int,
        timed: Callable[..., tuple[float, float, float]], rounds: int = 1) -> dict[str, Any]:
    """Both connectors on ``prompts`` (groups of prompts sharing a prefix), ``rounds`` pairs of
    fresh readers. ``timed(node, prompt, new_tokens)`` is ``vllm_engine._timed``. Returns the
    rows and the ratios."""
    from radixlink.integrations.vllm.nodes import NodeSpec, VllmNode, connector_config

    stores = {"radixlink": tmp / "versus-radixlink", EXAMPLE: tmp / "versus-example"}
    for path in stores.values():
        path.mkdir(parents=True)
    configs = {
        "radixlink": connector_config(f"file://{stores['radixlink']}"),
        EXAMPLE: {"kv_connector": EXAMPLE, "kv_role": "kv_both",
                  "kv_connector_extra_config": {"shared_storage_path": str(stores[EXAMPLE])}},
    }
    names = list(configs)
    timed_names = {"radixlink": "TimedRadixlinkConnector", EXAMPLE: "TimedExampleConnector"}
    hook_logs = {n: tmp / f"forwards-{n}.log" for n in names}
    outputs: dict[str, dict[tuple[int, int], list[int]]] = {n: {} for n in names}
    fresh: dict[str, list[float]] = {n: [] for n in names}
    share: dict[str, list[float]] = {n: [] for n in names}  # NOTE: first hits, to the forward
    first: dict[str, list[float]] = {n: [] for n in names}
    later: dict[str, list[float]] = {n: [] for n in names}
    identical = dict.fromkeys(names, 0)
    nodes: list[Any] = []
    try:
        for r, phase in enumerate(["writer"] + ["reader"] * rounds):
            specs = {n: NodeSpec(model=model, kv_transfer_config=configs[n])
                     if phase == "writer" else NodeSpec(
                         model=model, env={HOOK_LOG_ENV: str(hook_logs[n])},
                         kv_transfer_config={**configs[n], "kv_connector": timed_names[n],
                                             "kv_connector_module_path": HOOKS})
                     for n in names}  # fmt: skip
            started = {n: VllmNode(specs[n], tmp / f"versus-{phase}{r}-{i}.log")
                       for i, n in enumerate(names)}
            nodes += started.values()
            warm_up = [7, 8, 9] * 20  # NOTE: one-time setup, on tokens no group starts with
            for node in started.values():
                timed(node, warm_up, 2)
            for g, group in enumerate(prompts):
                for i, prompt in enumerate(group):
                    # NOTE: alternate who goes first, first hits included (by group and round)
                    for name in names[:: 1 if (g + i + r) % 2 == 0 else -1]:
                        node = started[name]
                        if phase == "reader":
                            time.sleep(IDLE_S)
                        sent = time.time()
                        result = node.generate([prompt], new_tokens)["results"][0]
                        if phase == "writer":
                            outputs[name][g, i] = result["output_ids"]
                            continue
                        if g == i == 0:
                            fresh[name].append(result["ttft_s"])
                        (first if i == 0 else later)[name].append(result["ttft_s"])
                        if i == 0:
                            starts = [t for t in _forward_starts(hook_logs[name]) if t > sent]
                            if not starts:
                                raise RuntimeError(
                                    f"no forward marked in {hook_logs[name]} after a request: "
                                    f"the {name} reader did not load {HOOKS}")
                            share[name].append(starts[0] - sent)
                        identical[name] += result["output_ids"] == outputs[name][g, i]
            for node in started.values():
                node.close()  # NOTE: a writer's close flushes its last saves
    finally:
        for node in nodes:
            node.close()
    total = sum(len(group) for group in prompts)
    # NOTE: both writers computed every prompt from an empty store: their outputs must agree
    writers_same = sum(outputs[names[0]][k] == outputs[names[1]][k] for k in outputs[names[0]])
    median = {n: statistics.median(first[n]) for n in names}
    fresh_median = {n: statistics.median(fresh[n]) for n in names}
    share_median = {n: statistics.median(share[n]) for n in names}
    stored = {n: _store_bytes(stores[n]) for n in names}
    rows = [{
        "connector": name,
        "fresh process's first hit TTFT s (median)": round(fresh_median[name], 4),
        "fresh processes' first hits s": " / ".join(f"{t:.3f}" for t in fresh[name]),
        "a group's first hit TTFT s (median)": round(median[name], 4),
        "of it to the forward s (median)": round(share_median[name], 4),
        "later prompts TTFT s (median)": round(statistics.median(later[name]), 4)
        if later[name] else None,
        "identical": f"{identical[name]}/{total * rounds}",
        "store MB": round(stored[name] / 1e6, 1),
    } for name in names]
    return {
        "rows": rows,
        "rounds": rounds,
        "fresh_first_hit_ratio": round(fresh_median["radixlink"] / fresh_median[EXAMPLE], 3),
        "first_hit_ratio": round(median["radixlink"] / median[EXAMPLE], 3),
        "to_forward_ratio": round(share_median["radixlink"] / share_median[EXAMPLE], 3),
        "store_bytes_ratio": round(stored[EXAMPLE] / max(stored["radixlink"], 1), 2),
        "writers_identical": f"{writers_same}/{total}",
    }
