"""The reference demo's conversation workload replayed on real engines (``demo --engine vllm``,
``demo --engine sglang``): the tokenizer of a Hugging Face model directory, one record per
served turn, the replay itself (turn k+1 on another node), the per-node tables and the
comparison with a cache-off run.

Owns what both real-engine demos share. Each engine's demo supplies ``serve`` (one request
at a time, with where its prompt tokens came from, from the engine's own counters) and its
nodes. Must not start engines.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from radixlink.engine.demo import LONG_PREFIX, faults_url, percentile, print_table
from radixlink.engine.weights import ChatTokenizer
from radixlink.engine.workload import WorkloadSpec, build_workload, schedule, turn_prompt


class DemoSetup(NamedTuple):
    """What both real-engine demos start from: a scratch folder, each node's store URL (the
    shared store, with each node's own faults when asked) and the workload."""

    tmp: str
    urls: list[str]
    spec: WorkloadSpec


def demo_setup(args: argparse.Namespace, engine: str) -> DemoSetup:
    """The reference demo's ``args`` as a ``DemoSetup``; prints the workload line."""
    tmp = tempfile.mkdtemp(prefix=f"radixlink-{engine}-demo-")
    store = args.store or f"file://{tmp}/store?capacity=4GiB"
    urls = [faults_url(store, args.faults, seed=i) if args.faults else store
            for i in range(args.nodes)]
    spec = WorkloadSpec(num_conversations=args.conversations, num_turns=args.turns,
                        num_system_prompts=args.system_prompts,
                        context_tokens=args.context_tokens)
    return DemoSetup(tmp, urls, spec)


def workload_line(args: argparse.Namespace, unit: str) -> str:
    """The demo's workload in one line (``unit``: what serves a turn, e.g. ``engine``)."""
    return (f"workload: {args.conversations} conversations x {args.turns} turns, "
            f"{args.system_prompts} shared system prompts of ~{args.context_tokens} tokens, "
            f"{args.max_new_tokens} new tokens per turn; turn k+1 goes to another {unit}\n")


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
    """One served request, its outputs and where its prompt tokens came from (``device``,
    ``store``, ``computed``)."""

    node: int
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    ttft_s: float = 0.0
    tokens: dict[str, int] = field(default_factory=dict)


# serve(node, prompts, max_new) -> one Turn per prompt (node = -1: replay sets it)
Serve = Callable[[Any, list[list[int]], int], list[Turn]]


def replay(nodes: Sequence[Any], tok: HFTokenizer, spec: WorkloadSpec, max_new: int,
           num_routes: int, serve: Serve) -> dict[tuple[int, int], Turn]:  # fmt: skip
    """Round k serves turn k of every conversation; turn k+1 goes to another route. Routes
    map onto ``nodes`` round-robin (the cache-off run serves every route on one engine: its
    outputs do not depend on where a turn runs). Requests run one at a time over all nodes:
    a request's counters are then its own, and its TTFT compares with the cache-off
    engine's, which serves alone.

    NOTE: engines on CPU share the same cores; two nodes serving at once each took about
    twice as long (vLLM's follow-up TTFT ratio read 1.2x that way, SGLang's 1.7x).
    """
    convs = build_workload(spec, tok)
    done: dict[tuple[int, int], Turn] = {}
    for turns in schedule(spec.num_conversations, spec.num_turns, num_routes):
        for route, conv_id, turn in turns:
            prev = done.get((conv_id, turn - 1))
            history = [] if prev is None else prev.prompt_ids + [
                t for t in prev.output_ids if t != tok.eos_token_id]
            prompt = turn_prompt(tok, convs[conv_id], turn, history)
            [record] = serve(nodes[route % len(nodes)], [prompt], max_new)
            record.node = route
            done[conv_id, turn] = record
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


def _shares(turns: list[Turn]) -> str:
    """Where the prompt tokens of ``turns`` came from: store, device and recomputed, each
    with its share of their sum."""
    counts = {src: sum(t.tokens.get(src, 0) for t in turns)
              for src in ("store", "device", "computed")}
    total = max(1, sum(counts.values()))
    return ", ".join(f"{src} {n} ({100 * n / total:.0f}%)" for src, n in counts.items())


def print_replies(on: dict[tuple[int, int], Turn], tok: HFTokenizer, num_turns: int) -> None:
    """Conversation 0's replies, first ids and text: a reader sees real text, not one
    repeated token."""
    for turn in range(num_turns):
        ids = on[0, turn].output_ids
        print(f"reply (conversation 0, turn {turn + 1}): first ids {ids[:4]}, "
              f"{tok.decode(ids)[:100]!r}")
    print()


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
    print("prompt tokens, cache on: " + _shares(list(on.values())) + "; in those follow-up "
          "turns: " + _shares([on[k] for k in keys]))
    same = sum(1 for k, t in off.items() if k in on and on[k].output_ids == t.output_ids)
    print(f"outputs identical to cache-off run: {same}/{len(off)} requests")
    return 0 if same == len(off) == len(on) else 1
