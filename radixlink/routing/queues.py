"""Each node's queue as the router sees it: the requests sent to it and not finished, with their
estimated service times, and the node's transfer link.

Owns that bookkeeping. The caller supplies the clock (``now``) and the estimates; every policy
reads the same ``NodeLoad`` snapshots.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeLoad:
    """What every policy knows of one node's load.

    Attributes:
        queue_s: expected seconds until the node's device could start a new request (the
            running request's remaining estimate plus every queued request's).
        link_s: expected seconds until the node's transfer link is free.
        num_queued: requests sent to the node and not finished (running included).
    """

    queue_s: float
    link_s: float
    num_queued: int


@dataclass(slots=True)
class _Job:
    node: int
    est_s: float
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
        self._pending_s = [0.0] * num_nodes  # estimates of queued, not started, jobs
        self._running: list[dict[Hashable, _Job]] = [{} for _ in range(num_nodes)]
        self._count = [0] * num_nodes
        self._link_free_at = [0.0] * num_nodes

    def add(self, node: int, req_id: Hashable, est_s: float) -> None:
        """``req_id`` was sent to ``node`` and should take ``est_s`` seconds of its device.

        Raises:
            ValueError: an unknown node or a request already in flight.
        """
        if not 0 <= node < self.num_nodes or req_id in self._jobs:
            raise ValueError(f"cannot add request {req_id!r} to node {node}: unknown node "
                             f"(0..{self.num_nodes - 1}) or request already in flight")
        self._jobs[req_id] = _Job(node, max(est_s, 0.0))
        self._pending_s[node] += max(est_s, 0.0)
        self._count[node] += 1

    def start(self, req_id: Hashable, now: float) -> None:
        """The node's device started ``req_id`` (a no-op for unknown or started requests)."""
        job = self._jobs.get(req_id)
        if job is None or job.started_at is not None:
            return
        job.started_at = now
        self._pending_s[job.node] -= job.est_s
        self._running[job.node][req_id] = job

    def finish(self, req_id: Hashable) -> None:
        """``req_id`` left the node (done or failed; a no-op for unknown requests)."""
        job = self._jobs.pop(req_id, None)
        if job is None:
            return
        if job.started_at is None:
            self._pending_s[job.node] -= job.est_s
        else:
            del self._running[job.node][req_id]
        self._count[job.node] -= 1
        if self._count[job.node] == 0:
            self._pending_s[job.node] = 0.0  # NOTE: drops float drift from += / -=

    def add_transfer(self, node: int, est_s: float, now: float) -> float:
        """Book a transfer of ``est_s`` seconds on ``node``'s link; returns when it should
        end (transfers on one link run one after another)."""
        end = max(now, self._link_free_at[node]) + max(est_s, 0.0)
        self._link_free_at[node] = end
        return end

    def load(self, node: int, now: float) -> NodeLoad:
        """The node's load at ``now``."""
        running = sum(max(0.0, j.est_s - (now - (j.started_at or now)))
                      for j in self._running[node].values())
        return NodeLoad(queue_s=max(0.0, self._pending_s[node]) + running,
                        link_s=max(0.0, self._link_free_at[node] - now),
                        num_queued=self._count[node])

    def loads(self, now: float) -> list[NodeLoad]:
        """Every node's load at ``now``, in node order."""
        return [self.load(node, now) for node in range(self.num_nodes)]
