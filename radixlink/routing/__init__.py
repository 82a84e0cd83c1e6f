"""The store-aware router: a KV-event index of which node holds which pages, each node's queue,
and the routing policies (docs/routing.md).

Re-exports only.
"""

from radixlink.routing.index import PrefixIndex
from radixlink.routing.policies import (
    POLICIES,
    Decision,
    DevicePrefix,
    LeastLoaded,
    Mooncake,
    Radixlink,
    RoundRobin,
    RouteQuery,
    RoutingPolicy,
    make_policy,
    policy_names,
)
from radixlink.routing.queues import NodeLoad, Placement, QueueBook, Waiting, place
from radixlink.routing.router import Router

__all__ = [
    "POLICIES",
    "Decision",
    "DevicePrefix",
    "LeastLoaded",
    "Mooncake",
    "NodeLoad",
    "Placement",
    "PrefixIndex",
    "QueueBook",
    "Radixlink",
    "RoundRobin",
    "RouteQuery",
    "Router",
    "RoutingPolicy",
    "Waiting",
    "make_policy",
    "place",
    "policy_names",
]
