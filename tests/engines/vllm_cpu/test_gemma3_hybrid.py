"""Real vLLM on CPU with Gemma-3-270M: five sliding-window layers to one full, so vLLM's hybrid
KV cache manager runs and the connector stores a full-attention pool and a sliding-window pool.
A node saves, a fresh node loads; outputs are token-identical to the session's cache-off
Gemma-3 engine (checked against HF transformers), and the loads show in vLLM's own counter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .conftest import tokenizer_of
from .kit import EXTERNAL, PROMPT_SETS, counter, prompt_set

NEW_TOKENS = PROMPT_SETS["gemma"].new_tokens


def test_gemma3_sliding_window_hybrid_loads_on_a_fresh_node(
        gemma3: str, gemma3_baseline: Any, start_node: Any, tmp_path: Path) -> None:  # fmt: skip
    from radixlink.integrations.vllm.nodes import NodeSpec, connector_config

    config = json.loads((Path(gemma3) / "config.json").read_text())
    assert config.get("sliding_window") and "full_attention" in config.get("layer_types", [])
    prompts = prompt_set(tokenizer_of(gemma3), "gemma")
    expected = gemma3_baseline.outputs["gemma"]

    def run(node: Any, todo: list[list[int]]) -> list[list[int]]:
        return [node.generate([p], NEW_TOKENS)["results"][0]["output_ids"] for p in todo]

    spec = NodeSpec(model=gemma3, kv_transfer_config=connector_config(f"file://{tmp_path}/pages"))
    # NOTE: started side by side; the loader reads nothing before the saver has closed
    saver, loader = start_node.many([(spec, "gemma-saver"), (spec, "gemma-loader")])
    first = run(saver, prompts[:1])
    assert counter(saver.metrics(), EXTERNAL) == 0  # an empty store
    # NOTE: later prompts may load the shared prefix the first one saved: vLLM's hybrid
    # manager keeps no sliding window at that boundary in its device cache
    assert first + run(saver, prompts[1:]) == expected
    saver.close()  # NOTE: close flushes the saves still in flight
    assert run(loader, prompts) == expected
    assert counter(loader.metrics(), EXTERNAL) > 0
