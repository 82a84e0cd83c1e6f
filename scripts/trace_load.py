"""How wide one LOAD and one OFFLOAD are: radixlink files and functions entered, by a
``sys.setprofile`` trace (every thread, so the store worker counts too).

The scenario of issue #23: a ``memory://`` store; node A offloads a 64-token prompt
(``write_through``); node B, holding a 16-token device prefix, loads the rest through the
public API (match + LOOKUP -> load -> wait_load -> unlock). The same for a FULL+SWA+MAMBA
cache. Usage::

    python scripts/trace_load.py            # a table
    python scripts/trace_load.py --json     # one JSON object
    python scripts/trace_load.py --files    # and the files each scenario entered
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from radixlink import CacheConfig, ExternalCacheLinker, InsertParams, UnifiedCache
from radixlink.contract import PoolName
from radixlink.hashing import Namespace
from radixlink.memory.layout import KVLayout, StateLayout
from radixlink.stores.memory import MemoryStore

PACKAGE = str(Path(__file__).resolve().parents[1] / "radixlink")
PS = 4
LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype=torch.float32, page_size=PS)
STATE = StateLayout(shapes=((2, 3), (4,)), dtype=torch.float32)
PROMPT = list(range(1000, 1064))  # 64 tokens
DEVICE_PREFIX = 16


class Calls:
    """The radixlink functions entered while ``active``, on any thread. Installed once, before
    any linker starts its worker threads (Python 3.11 cannot profile running threads)."""

    def __init__(self) -> None:
        self.functions: set[tuple[str, int, str]] = set()
        self.active = False

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if self.active and event == "call":
            code = frame.f_code
            if code.co_filename.startswith(PACKAGE):
                self.functions.add((code.co_filename, code.co_firstlineno, code.co_name))

    def files(self) -> list[str]:
        return sorted({Path(f).relative_to(Path(PACKAGE).parent).as_posix()
                       for f, _, _ in self.functions})


PROFILER = Calls()


@contextmanager
def traced() -> Iterator[Calls]:
    """Record what runs inside the block (the worker threads included)."""
    PROFILER.functions = set()
    PROFILER.active = True
    try:
        yield PROFILER
    finally:
        PROFILER.active = False
        PROFILER.functions = set(PROFILER.functions)


def make_cache(kind: str) -> UnifiedCache:
    swa, mamba = "swa" in kind, "mamba" in kind
    return UnifiedCache(CacheConfig(
        page_size=PS, num_tokens=512, kv_layout=LAYOUT, namespace=Namespace(model="trace"),
        sliding_window=8 if swa else None, swa_num_tokens=512 if swa else None,
        swa_layout=LAYOUT if swa else None, mamba_num_states=16 if mamba else None,
        state_layout=STATE if mamba else None, enable_external_cache_linker=True))


def compute(cache: UnifiedCache, tokens: list[int]) -> None:
    """Serve ``tokens`` on ``cache`` with no store load: write some K/V, insert, unlock."""
    m = cache.match_prefix(tokens)
    handle = cache.lock(m.last_node)
    new = cache.alloc(len(tokens) - m.prefix_len)
    assert new is not None
    kv = torch.cat([m.device_indices, new])
    pool = cache.pool(PoolName.KV)
    for layer in range(LAYOUT.num_layers):
        pool.k(layer)[new] = float(layer + 1)
        pool.v(layer)[new] = -float(layer + 1)
    slot = None
    if cache.pool(PoolName.MAMBA) is not None:
        slot = cache.hybrid.alloc_state()
        cache.pool(PoolName.MAMBA).write_state(
            slot, torch.arange(STATE.state_bytes, dtype=torch.uint8))
    cache.insert(InsertParams(key=tokens, value=kv, prev_prefix_len=m.prefix_len,
                              mamba_value=slot))
    cache.unlock(handle)


def load(cache: UnifiedCache, linker: ExternalCacheLinker) -> int:
    """The public LOAD: match with LOOKUP, load, wait, unlock. Returns the restored prefix."""
    m = cache.match_prefix(PROMPT, req_id="b")
    assert m.external_hit_len, "the store should hold the prompt"
    assert linker.load("b")
    out = linker.wait_load("b", timeout=30)
    assert out.ok, out.reason
    cache.unlock(out.lock)
    return out.prefix_len


def scenario(kind: str) -> dict[str, Any]:
    store = MemoryStore()
    a_cache = make_cache(kind)
    a = ExternalCacheLinker(a_cache, store)
    b_cache = make_cache(kind)
    b = ExternalCacheLinker(b_cache, store)
    compute(b_cache, PROMPT[:DEVICE_PREFIX])
    # warm up: the first call of anything imports and builds; trace a second prompt's paths
    compute(a_cache, [7] * 64)
    assert a.flush(timeout=30)
    with traced() as offload:
        compute(a_cache, PROMPT)
        assert a.flush(timeout=30)
        offload_calls = set(offload.functions)
    with traced() as loading:
        prefix = load(b_cache, b)
        load_calls = set(loading.functions)
    assert prefix == len(PROMPT), prefix
    a.close()
    b.close()
    return {"load": load_calls, "offload": offload_calls}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--files", action="store_true", help="list the files entered")
    args = parser.parse_args(argv)
    threading.setprofile(PROFILER)
    sys.setprofile(PROFILER)
    rows: dict[str, dict[str, Any]] = {}
    runs: dict[str, Calls] = {}
    for label, kind, which in (("FULL LOAD", "full", "load"), ("FULL OFFLOAD", "full", "offload"),
                               ("FULL+SWA+MAMBA LOAD", "swa+mamba", "load")):
        calls = Calls()
        calls.functions = scenario(kind)[which]
        runs[label] = calls
        rows[label] = {"files": len(calls.files()), "functions": len(calls.functions)}
    if args.json:
        out: dict[str, Any] = {k: dict(v) for k, v in rows.items()}
        if args.files:
            for label, calls in runs.items():
                out[label]["entered"] = calls.files()
        print(json.dumps(out, indent=2))
        return 0
    print(f"{'scenario':<22}{'files':>7}{'functions':>11}")
    for label, row in rows.items():
        print(f"{label:<22}{row['files']:>7}{row['functions']:>11}")
    if args.files:
        for label, calls in runs.items():
            print(f"\n{label}:\n  " + "\n  ".join(calls.files()))
    return 0

if __name__ == "__main__":
    sys.exit(main())
