"""Each node's queue as the router sees it: the requests sent to it and not finished, with their
estimated service times and when their transfers should end, and the node's transfer link.

Owns that bookkeeping and the node's expected serving order (``place``). The caller
supplies the clock (``now``) and the estimates; every policy reads the same ``NodeLoad``
snapshots.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Waiting:
    """A request sent to a node and not started, as the router expects it.

    Attributes:
        est_s: its expected device seconds.
        ready_in_s: expected seconds from the snapshot until its transfers end (0 = ready).
    """

    est_s: float
    ready_in_s: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.est_s) and math.isfinite(self.ready_in_s)):
            raise ValueError(f"a waiting request needs finite seconds, got est_s="
                             f"{self.est_s}, ready_in_s={self.ready_in_s}")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeLoad:
    """What every policy knows of one node's load.

    Attributes:
        queue_s: expected seconds until the node's device could start a new request (the
            running request's remaining estimate plus every queued request's).
        link_s: expected seconds until the node's transfer link is free.
        num_queued: requests sent to the node and not finished (running included).
        running_s: expected seconds until the running requests end (part of ``queue_s``).
        waiting: the requests not started, in arrival order.
    """

    queue_s: float
    link_s: float
    num_queued: int
    running_s: float = 0.0
    waiting: tuple[Waiting, ...] = ()

    @property
    def loading(self) -> bool:
        """Whether a waiting request's transfers are still going (the order then differs
        from arrival order: see ``place``)."""
        return any(w.ready_in_s > 0 for w in self.waiting)

    @property
    def behind(self) -> int:
        """Requests expected to start after a new one sent here (``plan_ttft``'s ``behind``):
        by Little's law the requests that arrive while it waits and runs number about as many
        as the node holds now, ``num_queued``. Each of them waits for its prefill."""
        return self.num_queued


def _starts(free_s: float, jobs: Sequence[Waiting]) -> list[float]:
    """When each of ``jobs`` (arrival order) starts on a device free in ``free_s`` seconds
    that, whenever it frees, starts the earliest-arrived request whose transfers have ended
    (and idles until one has): the order of the engine schedulers this models, which skip a
    request still waiting for its KV."""
    starts, left, t = [0.0] * len(jobs), list(range(len(jobs))), free_s
    while left:
        pick = next((i for i in left if jobs[i].ready_in_s <= t), None)
        if pick is None:  # idle until the first transfer ends (ties: the earliest arrival)
            pick = min(left, key=lambda i: jobs[i].ready_in_s)
            t = jobs[pick].ready_in_s
        starts[pick] = t
        t += jobs[pick].est_s
        left.remove(pick)
    return starts


@dataclass(frozen=True, slots=True)
class Placement:
    """What the node's expected serving order says of one more request there.

    Attributes:
        start_in_s: expected seconds until its device starts the request.
        overtake_s: seconds it adds, summed, to the starts of the requests waiting there.
    """

    start_in_s: float
    overtake_s: float


def place(load: NodeLoad, est_s: float, ready_in_s: float) -> Placement:
    """Replay the node's order with one more request (arriving last, ``est_s`` of device, its
    transfers ending in ``ready_in_s``) and without it.

    The new request runs before every waiting one whose transfers are still going when the
    device could take it, and delays each of those by up to its own length; a request that
    ends before their loads do adds nothing. With nothing waiting on a transfer the order is
    arrival order: it starts after everything queued (``queue_s``) and delays nobody.
    """
    if not load.loading:
        return Placement(start_in_s=max(load.queue_s, ready_in_s), overtake_s=0.0)
    before = _starts(load.running_s, load.waiting)
    after = _starts(load.running_s, (*load.waiting, Waiting(max(est_s, 0.0),
                                                            max(ready_in_s, 0.0))))
    return Placement(start_in_s=after[-1],
                     overtake_s=sum(max(0.0, a - b) for a, b in zip(after, before)))


@dataclass(slots=True)
class _Job:
    node: int
    est_s: float
    ready_at: float = float("-inf")
    started_at: float | None = None


class QueueBook:
    """Requests in flight per node, with estimated service seconds.

    Args:
        num_nodes: nodes, numbered ``0..num_nodes-1``.
    """

    def __init__(self, num_nodes: int):
        if num_nodes <= 0:
            raise ValueError(f"num_nodes must be positive, got {num_nodes}")
        self.num_nodes = num_nodes
        self._jobs: dict[Hashable, _Job] = {}
        self._waiting: list[dict[Hashable, _Job]] = [{} for _ in range(num_nodes)]
        self._running: list[dict[Hashable, _Job]] = [{} for _ in range(num_nodes)]
        self._link_free_at = [0.0] * num_nodes

    def add(self, node: int, req_id: Hashable, est_s: float,
            ready_at: float = float("-inf")) -> None:
        """``req_id`` was sent to ``node`` and should take ``est_s`` seconds of its device,
        once its transfers end at ``ready_at`` (the clock of ``now``; default: ready).

        Raises:
            ValueError: an unknown node, a request already in flight, a NaN estimate or a
                ready time that is NaN or +inf.
        """
        if not 0 <= node < self.num_nodes or req_id in self._jobs:
            raise ValueError(f"cannot add request {req_id!r} to node {node}: unknown node "
                             f"(0..{self.num_nodes - 1}) or request already in flight")
        if math.isnan(est_s) or math.isnan(ready_at) or ready_at == float("inf"):
            raise ValueError(f"request {req_id!r} needs a number of seconds and a finite "
                             f"ready time (or none), got est_s={est_s}, ready_at={ready_at}")
        self._jobs[req_id] = self._waiting[node][req_id] = _Job(node, max(est_s, 0.0),
                                                                 ready_at)

    def start(self, req_id: Hashable, now: float) -> None:
        """The node's device started ``req_id`` (a no-op for unknown or started requests)."""
        job = self._jobs.get(req_id)
        if job is None or job.started_at is not None:
            return
        job.started_at = now
        del self._waiting[job.node][req_id]
        self._running[job.node][req_id] = job

    def finish(self, req_id: Hashable) -> None:
        """``req_id`` left the node (done or failed; a no-op for unknown requests)."""
        job = self._jobs.pop(req_id, None)
        if job is None:
            return
        if job.started_at is None:
            del self._waiting[job.node][req_id]
        else:
            del self._running[job.node][req_id]

    def add_transfer(self, node: int, est_s: float, now: float) -> float:
        """Book a transfer of ``est_s`` seconds on ``node``'s link; returns when it should
        end (transfers on one link run one after another)."""
        end = max(now, self._link_free_at[node]) + max(est_s, 0.0)
        self._link_free_at[node] = end
        return end

    def load(self, node: int, now: float) -> NodeLoad:
        """The node's load at ``now``."""
        # NOTE: derived from the two tables each time (they hold a few requests per node):
        # one record of what is in flight, and no float drift from running sums
        running_jobs, waiting_jobs = self._running[node], self._waiting[node]
        running = sum(max(0.0, j.est_s - (now - j.started_at))
                      for j in running_jobs.values() if j.started_at is not None)
        waiting = tuple(Waiting(j.est_s, max(0.0, j.ready_at - now))
                        for j in waiting_jobs.values())
        return NodeLoad(queue_s=sum(w.est_s for w in waiting) + running,
                        link_s=max(0.0, self._link_free_at[node] - now),
                        num_queued=len(running_jobs) + len(waiting_jobs), running_s=running,
                        waiting=waiting)

    def loads(self, now: float) -> list[NodeLoad]:
        """Every node's load at ``now``, in node order."""
        return [self.load(node, now) for node in range(self.num_nodes)]
