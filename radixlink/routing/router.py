"""The router: KV events in, a node per request out. Combines the prefix index, each node's
queue, the moving estimates and one policy.

Owns the per-request query assembly. Must not execute requests or touch caches: the caller
(the demo's router process, the cluster simulation) reports what nodes do.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from radixlink.cost.estimates import Estimates
from radixlink.cost.tracking import EstimateTracker
from radixlink.cost.ttft import HIDE
from radixlink.routing.index import PrefixIndex
from radixlink.routing.policies import Decision, RouteQuery, RoutingPolicy, make_policy
from radixlink.routing.queues import QueueBook

StorePrefix = Callable[[Sequence[str]], int]


class Router:
    """Routes requests by ``policy`` over ``node_ids``.

    Args:
        policy: a policy name (``radixlink.routing.POLICIES``) or instance.
        node_ids: the nodes, as their KV event queues name them.
        tracker: the moving estimates every policy reads.
        page_size: tokens per page (the unit of the page hashes).
        store_prefix: ``hashes -> leading pages the store holds``; None = the store events in
            the index (which miss the store's own evictions).
        hide: for a policy given by name, the share of a node's queue a load may hide behind.
    """

    def __init__(self, policy: str | RoutingPolicy, node_ids: Sequence[str],
                 tracker: EstimateTracker, *, page_size: int,
                 store_prefix: StorePrefix | None = None, hide: float = HIDE):
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.policy = make_policy(policy, hide) if isinstance(policy, str) else policy
        self.index = PrefixIndex(node_ids)
        self.queues = QueueBook(len(node_ids))
        self.tracker = tracker
        self.page_size = page_size
        self._store_prefix = store_prefix or self.index.store_prefix_pages
        # NOTE: a request's pages count as expected on its node once its transfers should
        # have ended: before that a ready request sent there would start ahead of it
        self._expected: dict[Hashable, tuple[int, tuple[str, ...]]] = {}  # req -> node, pages
        self._loading: dict[Hashable, tuple[int, tuple[str, ...], float]] = {}  # + ready at

    @property
    def num_nodes(self) -> int:
        return self.queues.num_nodes

    @property
    def estimates(self) -> Estimates:
        return self.tracker.snapshot()

    def ingest(self, events: Iterable[Any], node_id: str | None = None) -> None:
        """Fold KV events into the index: radixlink's records (each names its node), or one
        vLLM node's stream (``node_id``: that node; ``PrefixIndex.apply``)."""
        self.index.apply(events, node_id)

    def query(self, hashes: Sequence[str], prompt_len: int, now: float) -> RouteQuery:
        """What every policy sees for a prompt of ``prompt_len`` tokens whose whole pages have
        the chained ``hashes``.

        Raises:
            ValueError: more pages than the prompt holds.
        """
        ps = self.page_size
        if len(hashes) * ps > prompt_len:
            raise ValueError(f"{len(hashes)} page hashes of {ps} tokens exceed the prompt's "
                             f"{prompt_len} tokens")
        has_store = self.estimates.store is not None
        store = self._store_prefix(hashes) * ps if has_store and hashes else 0
        self._promote(now)
        index = self.index
        return RouteQuery(prompt_len=prompt_len,
                          device_lens=tuple(p * ps for p in index.device_prefix_pages(hashes)),
                          store_len=store, loads=tuple(self.queues.loads(now)), page_size=ps,
                          expected_lens=tuple(p * ps for p in
                                              index.expected_prefix_pages(hashes)))

    def route(self, hashes: Sequence[str], prompt_len: int, now: float) -> Decision:
        """The policy's choice for one request (nothing is booked: see ``book``)."""
        return self.policy.choose(self.query(hashes, prompt_len, now), self.estimates)

    def book(self, node: int, req_id: Hashable, est_s: float,
             ready_at: float = float("-inf"), hashes: Sequence[str] = ()) -> None:
        """``req_id`` was sent to ``node`` and should take ``est_s`` of its device once its
        transfers end at ``ready_at`` (``now``'s clock; the default: it is ready); when it
        finishes, the node's device should hold the pages ``hashes`` (its prompt's whole
        pages: queries from ``ready_at`` on see them in ``expected_lens``, until ``finish``)."""
        self.queues.add(node, req_id, est_s, ready_at)
        if hashes:
            self._loading[req_id] = (node, tuple(hashes), ready_at)

    def start(self, req_id: Hashable, now: float) -> None:
        """The node's device started ``req_id``."""
        self.queues.start(req_id, now)

    def finish(self, req_id: Hashable) -> None:
        """``req_id`` left its node (done or failed; a no-op for unknown requests): its pages
        are no longer expected there (the node's KV events say what it holds)."""
        self.queues.finish(req_id)
        self._loading.pop(req_id, None)
        expected = self._expected.pop(req_id, None)
        if expected is not None:
            self.index.unexpect(*expected)

    def _promote(self, now: float) -> None:
        """Requests whose transfers should have ended by ``now``: their pages are expected."""
        ready = [req for req, (_, _, at) in self._loading.items() if at <= now]
        for req in ready:
            node, pages, _ = self._loading.pop(req)
            self.index.expect(node, pages)
            self._expected[req] = (node, pages)
