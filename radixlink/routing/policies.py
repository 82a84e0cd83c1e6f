"""Routing policies: which node serves a request, given what each policy may know.

Every policy sees the same ``RouteQuery`` (each node's device prefix, the store's prefix, each
node's load) and the same estimates; they differ only in which ways of getting the prefix they
consider (docs/routing.md, "Policies"). Pure apart from round-robin's counter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from radixlink.cost.estimates import Estimates
from radixlink.cost.ttft import HIDE, Offer, Plan, Source, plan_ttft
from radixlink.routing.queues import NodeLoad, place


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteQuery:
    """One request as the router sees it.

    Attributes:
        prompt_len: prompt tokens.
        device_lens: per node, tokens of the prompt's prefix its device holds.
        store_len: tokens of the prompt's prefix the shared store holds (0 without a store).
        loads: per node, its load (same order as ``device_lens``).
        page_size: tokens per page: every page-aligned prefix up to a holder's length is
            restorable too (0 = only the lengths given).
        expected_lens: per node, tokens of the prefix that requests routed there and not
            finished will leave on its device (empty = not known).
    """

    prompt_len: int
    device_lens: tuple[int, ...]
    store_len: int
    loads: tuple[NodeLoad, ...]
    page_size: int = 0
    expected_lens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.device_lens or len(self.device_lens) != len(self.loads):
            raise ValueError(f"need one device length and one load per node, got "
                             f"{len(self.device_lens)} and {len(self.loads)}")
        if self.expected_lens and len(self.expected_lens) != len(self.device_lens):
            raise ValueError(f"need one expected length per node, got "
                             f"{len(self.expected_lens)} for {len(self.device_lens)} nodes")


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """The chosen node and the plan the policy expects there."""

    node: int
    plan: Plan


class RoutingPolicy:
    """Base: score every node by the cost model over the sources this policy knows (``offers``)
    and take the lowest expected TTFT. Ties go to fewer queued requests, then to the node
    after the previous choice (so an idle cluster is filled in turn, not node 0 first)."""

    name = "base"

    def __init__(self, hide: float = HIDE) -> None:
        self._turn = 0
        self.hide = hide

    def offers(self, query: RouteQuery, node: int, estimates: Estimates) -> list[Offer]:
        """The sources this policy considers for ``node`` (none: device prefix + recompute)."""
        return []

    def plan(self, query: RouteQuery, node: int, estimates: Estimates) -> Plan:
        return self._plan(query, node, estimates, query.loads[node].queue_s)

    def device_len(self, query: RouteQuery, node: int) -> int:
        """Tokens of the prefix this policy counts on ``node``'s device when the request
        starts there (here: what its KV events say it holds now)."""
        return query.device_lens[node]

    def _plan(self, query: RouteQuery, node: int, estimates: Estimates,
              queue_s: float) -> Plan:
        return plan_ttft(prompt_len=query.prompt_len, device_len=self.device_len(query, node),
                         offers=self.offers(query, node, estimates), estimates=estimates,
                         queue_s=queue_s, link_s=query.loads[node].link_s, hide=self.hide)

    def score(self, plan: Plan, load: NodeLoad) -> float:
        """What the policy minimises (expected TTFT)."""
        return plan.ttft_s

    def choose(self, query: RouteQuery, estimates: Estimates) -> Decision:
        """The node with the lowest score."""
        n = len(query.loads)
        best: tuple[float, int, int] | None = None
        choice: Decision | None = None
        for node in range(n):
            plan = self.plan(query, node, estimates)
            key = (self.score(plan, query.loads[node]), query.loads[node].num_queued,
                   (node - self._turn) % n)
            if best is None or key < best:
                best, choice = key, Decision(node=node, plan=plan)
        assert choice is not None
        self._turn = (choice.node + 1) % n
        return choice


class RoundRobin(RoutingPolicy):
    """Nodes in turn, whatever they hold or queue."""

    name = "round_robin"

    def choose(self, query: RouteQuery, estimates: Estimates) -> Decision:
        node = self._turn % len(query.loads)
        self._turn = node + 1
        return Decision(node=node, plan=self.plan(query, node, estimates))


class LeastLoaded(RoutingPolicy):
    """The node whose device frees up first; prefixes ignored."""

    name = "least_loaded"

    def score(self, plan: Plan, load: NodeLoad) -> float:
        return load.queue_s


class DevicePrefix(RoutingPolicy):
    """Queue + recompute of what the node's own device lacks (the KV-aware routers of NVIDIA
    Dynamo, llm-d and SGLang score device-cached prefixes only)."""

    name = "device_prefix"


class Mooncake(RoutingPolicy):
    """Device prefix, or a copy of the longest prefix another node's device holds (Mooncake
    FAST'25, Conductor: KV-cache-centric scheduling with cache transfer between instances)."""

    name = "mooncake"

    def offers(self, query: RouteQuery, node: int, estimates: Estimates) -> list[Offer]:
        peer = max((n for i, n in enumerate(query.device_lens) if i != node), default=0)
        if estimates.peer is None or peer <= self.device_len(query, node):
            return []
        return [Offer(source=Source.PEER, lengths=(peer,), transfer=estimates.peer,
                      step=query.page_size)]


class Radixlink(Mooncake):
    """Every tier: the node's device, another node's device, and the shared store; each
    load weighed against recomputing (it may be declined). A node's device also counts the
    prefix that requests already routed there will have computed before this one starts
    (``RouteQuery.expected_lens``): a request on a document still in prefill goes behind it
    instead of computing it again elsewhere."""

    name = "radixlink"

    def device_len(self, query: RouteQuery, node: int) -> int:
        held = query.device_lens[node]
        return max(held, query.expected_lens[node]) if query.expected_lens else held

    def offers(self, query: RouteQuery, node: int, estimates: Estimates) -> list[Offer]:
        out = super().offers(query, node, estimates)
        if estimates.store is not None and query.store_len > self.device_len(query, node):
            out.append(Offer(source=Source.STORE, lengths=(query.store_len,),
                             transfer=estimates.store, step=query.page_size))
        return out

    def plan(self, query: RouteQuery, node: int, estimates: Estimates) -> Plan:
        """As the others, but the wait is when the node would start this request in the order
        it serves (``routing.queues.place``): a request that is ready goes ahead of those
        still loading, so the queue's sum overstates its wait there. Never more than that
        sum: its own load is already in the plan."""
        load = query.loads[node]
        first = self._plan(query, node, estimates, load.queue_s)
        if not load.loading:
            return first
        start = place(load, first.prefill_s, _ready_in(first, load)).start_in_s
        return self._plan(query, node, estimates, min(load.queue_s, start))

    def score(self, plan: Plan, load: NodeLoad) -> float:
        """The request's expected TTFT plus what it would add to the TTFTs of the node's
        requests still waiting on transfers: a node starts whichever request is ready, so a
        long prefill sent there runs ahead of them (docs/routing.md, "Policies")."""
        return plan.ttft_s + place(load, plan.prefill_s, _ready_in(plan, load)).overtake_s


def _ready_in(plan: Plan, load: NodeLoad) -> float:
    """Seconds until the plan's transfers end: they queue on the node's link."""
    return load.link_s + plan.load_s if plan.load_len else 0.0


POLICIES: dict[str, type[RoutingPolicy]] = {
    cls.name: cls for cls in (RoundRobin, LeastLoaded, DevicePrefix, Mooncake, Radixlink)
}


def make_policy(name: str, hide: float = HIDE) -> RoutingPolicy:
    """A fresh policy by name (``hide``: see ``radixlink.cost.plan_ttft``).

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    try:
        return POLICIES[name](hide)
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; choose from "
                         f"{', '.join(POLICIES)}") from None


def policy_names(names: Sequence[str] | None = None) -> list[str]:
    """``names`` checked against the registry (all policies for None)."""
    out = list(POLICIES) if not names else list(names)
    for name in out:
        make_policy(name)
    return out
