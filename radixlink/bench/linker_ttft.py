"""The TTFT part of `radixlink bench linker`: store-hit requests of the reference engine, whole
load then compute vs layer-wise (the forward of layer i starts when layer i has landed),
side by side in one run.

Owns only this part of the benchmark; drives ``Engine`` through its public API.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from pydoc_data.topics import topics
from typing import Any

import torch

from radixlink.cache import UnifiedCache
from radixlink.contract import ComponentType
from radixlink.engine.engine import Engine, cache_config
from radixlink.engine.weights import load_model
from radixlink.linker.core import ExternalCacheLinker
from radixlink.stores.registry import open_store

MODES = ("whole", "layerwise")


def _prompts(tokenizer: Any, count: int, prompt_tokens: int) -> list[list[int]]:
    """``count`` distinct prompts of ``prompt_tokens`` tokens of real text (pydoc topics)."""
    names = sorted(topics)
    out = []
    for i in range(count):
        text, k = "", i
        while len(tokenizer.encode(text)) < prompt_tokens:
            text += topics[names[k % len(names)]]
            k += count
        out.append(tokenizer.encode(text)[:prompt_tokens])
    return out


def _engine(model: Any, tokenizer: Any, store: Any, num_tokens: int, layerwise: bool) -> Engine:
    cache = UnifiedCache(cache_config(model.spec, num_tokens=num_tokens, linker=True))
    return Engine(model, tokenizer, cache, ExternalCacheLinker(cache, store),
                  layerwise=layerwise)


def measure(model_name: str, store_url: str, *, prompts: int, prompt_tokens: int,
            rounds: int) -> dict[str, Any]:
    """Prompts are computed and offloaded by a writer engine; then each is served by a fresh
    reader engine (empty device, so the prefix is a store hit), whole and layer-wise in
    alternating order, ``rounds`` times. Returns per mode the median TTFT and its parts."""
    torch.set_num_threads(1)
    model, tokenizer = load_model(model_name)
    if ComponentType.MAMBA in model.spec.layer_types:
        raise ValueError(f"{model_name} has Mamba layers: the engine loads it whole (its state "
                         "is needed before layer 0); pick a model without them")
    tmp = tempfile.mkdtemp(prefix="radixlink-bench-ttft-")
    store = open_store(store_url.replace("{dir}", tmp))
    try:
        texts = _prompts(tokenizer, prompts, prompt_tokens)
        num_tokens = prompt_tokens + 64
        writer = _engine(model, tokenizer, store, num_tokens * prompts, True)
        for prompt in texts:
            writer.generate(prompt, 1)
        writer.flush()
        readers = {mode: _engine(model, tokenizer, store, num_tokens, mode == "layerwise")
                   for mode in MODES}
        runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        for r in range(-1, rounds):  # round -1 warms the readers' pools up, untimed
            for i, prompt in enumerate(texts):
                order = MODES if (r + i) % 2 == 0 else MODES[::-1]
                for mode in order:
                    engine = readers[mode]
                    # NOTE: an empty device, so the prompt's prefix is a store hit
                    engine.cache.evict(engine.cache.stats()["cached_tokens"])
                    res = engine.generate(prompt, 1, req_id=f"{mode}{r}:{i}")
                    assert res.num_from_store > 0 and res.layerwise == (mode == "layerwise"), (
                        f"{mode} request did not load from the store: {res}")
                    if r < 0:
                        continue
                    runs[mode].append({"ttft_s": res.ttft_s, "load_s": res.load_s,
                                       "prefill_s": res.prefill_s,
                                       "loaded_mb": res.loaded_bytes / 1e6,
                                       "from_store": res.num_from_store,
                                       "computed": res.num_computed})
        for engine in readers.values():
            engine.linker.close()
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    rows: list[dict[str, Any]] = []
    for mode in MODES:
        got = runs[mode]
        rows.append({
            "mode": mode, "requests": len(got),
            "ttft ms (median)": statistics.median(x["ttft_s"] for x in got) * 1e3,
            "load wait ms": statistics.median(x["load_s"] for x in got) * 1e3,
            "prefill ms": statistics.median(x["prefill_s"] for x in got) * 1e3,
            "store tokens": statistics.median(x["from_store"] for x in got),
            "computed tokens": statistics.median(x["computed"] for x in got),
            "loaded MB": statistics.median(x["loaded_mb"] for x in got),
        })
    whole = rows[0]["ttft ms (median)"]
    for row in rows:
        row["vs whole"] = row["ttft ms (median)"] / whole
    return {"model": model_name, "store": store_url.split("?")[0], "rows": rows, "runs": runs}
