"""``LoadTable`` (who waits on which transfer, outcomes, leaving), ``RememberedLookups`` (count,
byte and age bounds) and the store ``CircuitBreaker`` / ``StoreGuard``: pure bookkeeping,
tested without a cache."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch

from radixlink.linker.breaker import BreakerConfig, BreakerState, CircuitBreaker, StoreGuard
from radixlink.linker.loader import Reservation
from radixlink.linker.loads import LoadTable, Member, Transfer
from radixlink.linker.lookup import Lookup, RememberedLookups
from radixlink.linker.outcomes import LoadOutcome


def lookup(tag: str, pages: int = 2, prefix: int = 0, created: float = 0.0) -> Lookup:
    return Lookup(tokens=np.zeros(prefix + 4 * pages, dtype="<u4"), prefix_len=prefix,
                  last_node=None, keys=[f"{tag}{i}" for i in range(pages)], created=created)


def member(req_id: Any, found: Lookup, deadline: float = 1e9) -> Member:
    return Member(req_id=req_id, lookup=found, deadline=deadline)


def transfer(job_id: int, found: Lookup) -> Transfer:
    reservation = Reservation(lookup=found, device_slots=torch.empty(0), handle=object())
    return Transfer(job_id=job_id, reservation=reservation)


def outcome(req_id: Any) -> LoadOutcome:
    return LoadOutcome(req_id=req_id, ok=True, prefix_len=0, device_indices=torch.empty(0),
                       last_node=None, lock=object())


# ---------------------------------------------------------------- LoadTable


def test_identical_loads_share_until_the_transfer_finishes() -> None:
    """A second load of the same pages from the same prefix joins the first transfer; a load
    from another prefix does not; once finished, neither can be joined and both members are
    handed back for delivery."""
    table = LoadTable()
    found = lookup("a")
    first = transfer(1, found)
    table.start(first)
    table.join(member("r1", found), first)
    assert table.shared(lookup("a")) is first
    assert table.shared(lookup("a", prefix=4)) is None
    table.join(member("r2", lookup("a")), first)
    done = table.finish(1)
    assert done is first and [m.req_id for m in done.members] == ["r1", "r2"]
    assert table.shared(found) is None and table.waiting() == []
    assert table.finish(99) is None  # an offload's job id


def test_the_last_member_leaving_cancels_the_transfer() -> None:
    """A member that times out or cancels leaves alone; the transfer is cancelled (and no
    longer joinable) only when the last one leaves."""
    table = LoadTable()
    found = lookup("a")
    shared = transfer(1, found)
    table.start(shared)
    leader, follower = member("leader", found), member("follower", found)
    table.join(leader, shared)
    table.join(follower, shared)
    assert table.leave(follower) is None and not shared.cancelled
    assert table.shared(found) is shared
    assert table.leave(leader) is shared and shared.cancelled
    assert table.shared(found) is None and table.member("leader") is None


def test_a_request_id_cannot_load_twice_while_loading_or_unclaimed() -> None:
    """check_new refuses a req_id that waits on a transfer or holds an outcome not taken."""
    table = LoadTable()
    found = lookup("a")
    job = transfer(1, found)
    table.start(job)
    table.join(member("r", found), job)
    with pytest.raises(ValueError, match="already has a load in flight"):
        table.check_new("r")
    table.finish(1)
    table.put(outcome("r"))
    with pytest.raises(ValueError, match="not yet taken"):
        table.check_new("r")
    assert table.take("r") is not None and table.take("r") is None
    table.check_new("r")


def test_waiting_members_keep_load_order_and_stats_count() -> None:
    """waiting() lists members in load() order (what ranks agree on); stats count them."""
    table = LoadTable()
    jobs = [transfer(i, lookup(f"k{i}")) for i in range(3)]
    for i, job in enumerate(jobs):
        table.start(job)
        table.join(member(f"r{i}", job.reservation.lookup), job)
    assert [m.req_id for m in table.waiting()] == ["r0", "r1", "r2"]
    table.put(outcome("x"))
    assert table.stats() == {"loads_in_flight": 3, "loads_waiting": 3, "unclaimed_outcomes": 1}


# ---------------------------------------------------------------- RememberedLookups


def test_remembered_lookups_drop_oldest_past_count_bytes_and_age() -> None:
    """Past max_count or max_bytes the oldest go first; past ttl_s (by the injected clock)
    every expired one goes on the next access; a dropped lookup pops as None."""
    now = [0.0]
    memory = RememberedLookups(max_count=3, max_bytes=10_000, ttl_s=5.0, clock=lambda: now[0])
    for i in range(4):
        memory.put(i, lookup(f"c{i}", created=now[0]))
    assert len(memory) == 3 and memory.pop(0) is None and memory.num_dropped == 1
    size = lookup("x").num_bytes
    small = RememberedLookups(max_count=100, max_bytes=2 * size, ttl_s=None)
    for i in range(5):
        small.put(i, lookup("x"))
    assert len(small) == 2 and small.stats()["lookup_bytes_remembered"] <= 2 * size
    now[0] = 6.0
    memory.put("fresh", lookup("f", created=6.0))
    assert len(memory) == 1 and memory.pop("fresh") is not None


# ---------------------------------------------------------------- breaker


def test_breaker_opens_after_failures_probes_after_cooldown_and_closes() -> None:
    """CLOSED -> OPEN after 3 failures (calls skipped); after the jittered cool-down one probe
    goes through (HALF_OPEN); a failed probe doubles the cool-down, a good one closes it."""
    now = [0.0]
    breaker = CircuitBreaker(BreakerConfig(failure_threshold=3, cooldown_s=1.0, jitter=0.2),
                             clock=lambda: now[0], rng=random.Random(0))
    for _ in range(3):
        assert breaker.allow()
        breaker.record_failure()
    assert breaker.state is BreakerState.OPEN and not breaker.allow()
    now[0] = 1.3
    assert breaker.allow() and breaker.state is BreakerState.HALF_OPEN
    assert not breaker.allow()  # one probe at a time
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    now[0] = 1.3 + 1.5  # below the doubled cool-down (2 s x [0.8, 1.2])
    assert not breaker.allow()
    now[0] = 1.3 + 2.5
    assert breaker.allow()
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED and breaker.stats()["store_breaker_opens"] == 2


class _SlowStore:
    """A store whose exists blocks until released (a paused server), or raises."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.fail = False

    def exists(self, keys: Sequence[str]) -> list[bool]:
        if self.fail:
            raise RuntimeError("client bug")
        self.release.wait(10)
        return [True] * len(keys)


def test_guard_bounds_a_hung_store_by_the_budget_and_never_raises() -> None:
    """A hung exists costs the caller ~budget_s; while it is still stuck further calls fail at
    once (no queue behind it); after 3 failures the breaker skips the store; any exception of
    the store is a failure, not a raise."""
    store, now = _SlowStore(), [0.0]
    guard = StoreGuard(store, CircuitBreaker(BreakerConfig(budget_s=0.05, failure_threshold=3),
                                             clock=lambda: now[0]))
    start = time.monotonic()
    assert guard.exists(["a"]) is None
    assert time.monotonic() - start < 1.0
    assert guard.exists(["a"]) is None and guard.exists(["a"]) is None
    assert guard.breaker.state is BreakerState.OPEN
    assert guard.exists(["a"]) is None and guard.last_skipped
    store.release.set()
    store.fail = True
    now[0] = 100.0  # past the cool-down: the probe goes through and hits the failure
    assert guard.exists(["a"]) is None and guard.stats()["store_call_failures"] == 4
    guard.close()
