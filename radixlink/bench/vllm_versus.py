"""The first store hit inside real vLLM, radixlink's connector against vLLM's own
``ExampleConnector`` (safetensors files per request and layer, loaded in the worker), in one
run on the same workload and the same kind of store (a directory on the same filesystem).

Per connector: a writer engine serves ``groups`` groups of prompts sharing a prefix (the
saves), then stops; a fresh reader engine, on the writer's store, serves the first prompt of
each group (a store hit with a cold device cache: the first store hit's TTFT) and then the
others. The two writers run side by side, then the two readers, requests alternating which
connector goes first (for the first hits: by group), each reader request after ``IDLE_S`` of
quiet. Outputs are checked against the
writer's (greedy, fp32).

Owns this part of `radixlink bench vllm`; the engines are ``nodes.VllmNode``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXAMPLE = "ExampleConnector"
IDLE_S = 1.5
"""The pause before each timed request: vLLM's worker spins on its shared-memory queue for 1 s
after its last message (``shm_broadcast``'s ``busy_loop_s``), and both engines' workers are
bound to the same core here, so a request sent right after the other engine's ran against that
spin: first hits took 0.5 s or 0.05 s by that alone, for either connector."""


def _store_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def run(model: str, tmp: Path, prompts: list[list[list[int]]], new_tokens: int,
        timed: Callable[..., tuple[float, float, float]]) -> dict[str, Any]:
    """Both connectors on ``prompts`` (groups of prompts sharing a prefix). ``timed(node,
    prompt, new_tokens)`` is ``vllm_engine._timed``. Returns the rows and the ratios."""
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
    outputs: dict[str, dict[tuple[int, int], list[int]]] = {n: {} for n in names}
    first: dict[str, list[float]] = {n: [] for n in names}
    later: dict[str, list[float]] = {n: [] for n in names}
    identical = dict.fromkeys(names, 0)
    nodes: list[Any] = []
    try:
        for phase in ("writer", "reader"):
            started = {n: VllmNode(NodeSpec(model=model, kv_transfer_config=configs[n]),
                                   tmp / f"versus-{phase}-{i}.log")
                       for i, n in enumerate(names)}
            nodes += started.values()
            warm_up = [7, 8, 9] * 20  # NOTE: one-time setup, on tokens no group starts with
            for node in started.values():
                timed(node, warm_up, 2)
            for g, group in enumerate(prompts):
                for i, prompt in enumerate(group):
                    # NOTE: alternate who goes first, first hits included (by group)
                    for name in names[:: 1 if (g + i) % 2 == 0 else -1]:
                        node = started[name]
                        if phase == "reader":
                            time.sleep(IDLE_S)
                        result = node.generate([prompt], new_tokens)["results"][0]
                        if phase == "writer":
                            outputs[name][g, i] = result["output_ids"]
                            continue
                        (first if i == 0 else later)[name].append(result["ttft_s"])
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
    stored = {n: _store_bytes(stores[n]) for n in names}
    rows = [{
        "connector": name,
        "first store hit TTFT s (median)": round(median[name], 4),
        "first hits s": " / ".join(f"{t:.3f}" for t in first[name]),
        "later prompts TTFT s (median)": round(statistics.median(later[name]), 4)
        if later[name] else None,
        "identical": f"{identical[name]}/{total}",
        "store MB": round(stored[name] / 1e6, 1),
    } for name in names]
    return {
        "rows": rows,
        "first_hit_ratio": round(median["radixlink"] / median[EXAMPLE], 3),
        "store_bytes_ratio": round(stored[EXAMPLE] / max(stored["radixlink"], 1), 2),
        "writers_identical": f"{writers_same}/{total}",
    }
