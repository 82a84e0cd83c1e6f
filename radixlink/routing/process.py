"""A router in its own process, for `radixlink demo --route POLICY`: the coordinator asks it which
node serves each turn and forwards what the nodes report (KV events, per-request timings).

Owns the process, its message protocol and the demo's starting estimates. Routing decisions
are ``Router``'s; this module imports nothing from radixlink.engine (records are duck-typed).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
import traceback
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from radixlink.cost.estimates import Estimates, PrefillEstimate, TransferEstimate
from radixlink.cost.tracking import EstimateTracker
from radixlink.cost.ttft import Source
from radixlink.hashing import page_hashes
from radixlink.routing.router import Router

# NOTE: a follow-up turn's own new tokens (closing the reply, the user's next message): the
# coordinator holds no tokenizer, so it routes on the history it has (the cacheable prefix)
# plus this many tokens.
SUFFIX_TOKENS = 64

# Where the demo router's estimates start (SmolLM2-135M on one CPU thread, a directory
# store); they are refitted from every request's timings as the run goes.
DEMO_PRIOR = Estimates(prefill=PrefillEstimate(token_s=5e-3, overhead_s=0.05),
                       bytes_per_token=1, store=TransferEstimate(bytes_per_s=200e6,
                                                                 latency_s=5e-3),
                       decode_token_s=0.1)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInfo:
    """What the router must know of the nodes' caches to hash prompts as they do.

    Attributes:
        namespace: the caches' namespace (the hash chain's seed).
        page_size: tokens per page.
        bytes_per_token: KV bytes per token moved by a store load.
        hash_algo: the page hash function.
    """

    namespace: Any
    page_size: int
    bytes_per_token: int
    hash_algo: str = "sha256"


def _observe(tracker: EstimateTracker, result: Any) -> None:
    """Feed one request's engine record (``RequestResult``) to the estimates."""
    cached = result.num_from_device + result.num_from_store
    tracker.observe_prefill(result.num_computed, cached, result.prefill_s)
    if result.num_from_store and result.loaded_bytes and not result.load_failed:
        tracker.observe_load(Source.STORE, result.loaded_bytes, result.load_s)
    if len(result.output_ids) > 1:
        tracker.observe_decode(len(result.output_ids) - 1, result.decode_s)


def _route(router: Router, info: NodeInfo, key: Hashable, history: Sequence[int],
           max_new_tokens: int, counts: Counter[str]) -> int:
    """Hash what the coordinator has of the prompt as the nodes' caches do, pick a node and
    book the request there (its load, prefill and decode, by the current estimates)."""
    whole = len(history) // info.page_size * info.page_size
    hashes = page_hashes(list(history[:whole]), info.page_size, info.namespace,
                         algo=info.hash_algo)
    decision = router.route(hashes, len(history) + SUFFIX_TOKENS, time.monotonic())
    plan = decision.plan
    router.book(decision.node, key, plan.load_s + plan.prefill_s
                + max_new_tokens * router.estimates.decode_token_s, hashes=hashes)
    counts[f"node {decision.node}"] += 1
    counts[f"planned {plan.source.value}"] += 1
    return decision.node


def _router_main(policy: str, num_nodes: int, max_new_tokens: int, inbox: Any,
                 outbox: Any) -> None:
    """The router process: ("begin", NodeInfo) / ("route", key, history) -> ("routed", key,
    node) / ("done", key, result, events) / ("events", events) / ("summary",) -> summary /
    ("stop",)."""
    try:
        router: Router | None = None
        info: NodeInfo | None = None
        counts: Counter[str] = Counter()
        while True:
            msg = inbox.get()
            if msg[0] == "begin":
                info = msg[1]
                prior = replace(DEMO_PRIOR, bytes_per_token=info.bytes_per_token)
                router = Router(policy, [str(i) for i in range(num_nodes)],
                                EstimateTracker(prior, typical_tokens=1024),
                                page_size=info.page_size)
            elif msg[0] == "route":
                assert router is not None and info is not None, "route before begin"
                node = _route(router, info, msg[1], msg[2], max_new_tokens, counts)
                outbox.put(("routed", msg[1], node))
            elif msg[0] == "done":
                assert router is not None
                router.finish(msg[1])
                _observe(router.tracker, msg[2])
                router.ingest(msg[3])
            elif msg[0] == "events":
                assert router is not None
                router.ingest(msg[1])
            elif msg[0] == "summary":
                index = router.index.stats() if router is not None else {}
                outbox.put(("summary", {"policy": policy, **counts, **index,
                                        "estimates": repr(router.estimates if router else None)}))
            else:
                return
    except BaseException:  # NOTE: report any failure to the coordinator instead of hanging it
        outbox.put(("error", traceback.format_exc()))


class RouterProcess:
    """The coordinator's handle on a router process. Use as a context manager.

    ``NodePool.run(..., router=...)`` calls ``begin`` once per run, ``route`` for every turn,
    ``done`` for every served turn and ``ingest`` for events nodes emit between turns.

    Args:
        policy: routing policy name (``radixlink.routing.POLICIES``).
        num_nodes: engine nodes, numbered from 0 (their KV events carry ``str(node)``).
        max_new_tokens: tokens each request decodes (its share of the node's queue).
        timeout_s: how long to wait for a reply before declaring the router dead.

    Raises:
        ValueError: an unknown policy (before any process starts).
    """

    def __init__(self, policy: str, num_nodes: int, *, max_new_tokens: int,
                 timeout_s: float = 60.0):
        from radixlink.routing.policies import make_policy

        make_policy(policy)  # NOTE: a bad name fails here, not inside the child
        ctx = mp.get_context("spawn")
        self.policy = policy
        self._inbox, self._outbox = ctx.Queue(), ctx.Queue()
        self._proc = ctx.Process(target=_router_main, daemon=True,
                                 args=(policy, num_nodes, max_new_tokens, self._inbox,
                                       self._outbox))
        self._timeout = timeout_s

    def __enter__(self) -> RouterProcess:
        self._proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._inbox.put(("stop",))
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()

    def _reply(self, kind: str) -> Any:
        try:
            got = self._outbox.get(timeout=self._timeout)
        except queue.Empty:
            raise RuntimeError(f"the router process did not answer within {self._timeout} s"
                               ) from None
        if got[0] == "error":
            raise RuntimeError(f"the router process failed:\n{got[1]}")
        assert got[0] == kind, f"router replied {got[0]!r}, expected {kind!r}"
        return got

    def begin(self, info: NodeInfo | Mapping[str, Any] | None) -> None:
        """The nodes' cache facts (from the nodes, once their engines are built).

        Raises:
            ValueError: no facts (the nodes were built without KV events).
        """
        if info is None:
            raise ValueError("the nodes report no cache facts: build them with "
                             "NodeSettings(kv_events=True) to route them")
        self._inbox.put(("begin", info if isinstance(info, NodeInfo) else NodeInfo(**info)))

    def route(self, key: Hashable, history: Sequence[int]) -> int:
        """The node for request ``key`` whose prompt extends ``history`` (the token ids the
        coordinator has: the previous turn's prompt and reply; empty for a first turn)."""
        self._inbox.put(("route", key, list(history)))
        _, got_key, node = self._reply("routed")
        assert got_key == key, f"router answered for {got_key!r}, asked for {key!r}"
        return int(node)

    def done(self, key: Hashable, result: Any, events: Sequence[Any]) -> None:
        """Request ``key`` finished with engine record ``result`` (a ``RequestResult``); the
        node's KV events since its previous report."""
        self._inbox.put(("done", key, result, list(events)))

    def ingest(self, events: Sequence[Any]) -> None:
        """KV events a node emitted outside any request (offloads landing after a flush)."""
        if events:
            self._inbox.put(("events", list(events)))

    def summary(self) -> dict[str, Any]:
        """Decisions per node and planned source, index sizes, the final estimates."""
        self._inbox.put(("summary",))
        return dict(self._reply("summary")[1])


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def routed_summary(policy: str, records: Sequence[Any]) -> dict[str, Any]:
    """One row for a routed demo run: prompt tokens by source, and TTFT both as the engine
    measures it (from the request's start on its node) and including the wait in the node's
    queue (``record.wait_s``), over every turn and over follow-up turns only."""
    res = [r.result for r in records]
    with_wait = [r.result.ttft_s + getattr(r, "wait_s", 0.0) for r in records]
    follow = [w for r, w in zip(records, with_wait) if r.turn > 0]
    nodes = Counter(r.node for r in records)
    return {
        "route": policy, "requests": len(res),
        "per node": "/".join(str(nodes[n]) for n in sorted(nodes)),
        "device tok": sum(r.num_from_device for r in res),
        "store tok": sum(r.num_from_store for r in res),
        "prefill tok": sum(r.num_computed for r in res),
        "TTFT p50 s": round(_pct([r.ttft_s for r in res], 50), 3),
        "TTFT p99 s": round(_pct([r.ttft_s for r in res], 99), 3),
        "+queue p50 s": round(_pct(with_wait, 50), 3),
        "+queue p99 s": round(_pct(with_wait, 99), 3),
        "follow-up +queue p50 s": round(_pct(follow, 50), 3),
    }
