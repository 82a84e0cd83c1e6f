"""Routing policies, the queue book and the Router: every policy reads the same query; they
differ only in the sources they consider. Expected choices are worked out by hand."""

from __future__ import annotations

import pytest
import torch

from radixlink import CacheConfig, InsertParams, UnifiedCache, page_hashes
from radixlink.cost import Estimates, EstimateTracker, PrefillEstimate, TransferEstimate
from radixlink.kvevents import KVEventQueue
from radixlink.routing import (
    POLICIES,
    Decision,
    NodeLoad,
    Placement,
    QueueBook,
    RouteQuery,
    Router,
    Waiting,
    make_policy,
    place,
)

BPT = 131072
PREFILL = PrefillEstimate(token_s=1e-4, overhead_s=0.005)


def est(store_gbps: float | None = None, peer_gbps: float | None = None) -> Estimates:
    def path(gbps: float | None) -> TransferEstimate | None:
        return None if gbps is None else TransferEstimate(bytes_per_s=gbps * 1e9,
                                                          latency_s=0.01)

    return Estimates(prefill=PREFILL, bytes_per_token=BPT, store=path(store_gbps),
                     peer=path(peer_gbps))


def query(device: tuple[int, ...], queues: tuple[float, ...], store_len: int = 0,
          prompt_len: int = 8292) -> RouteQuery:
    loads = tuple(NodeLoad(queue_s=q, link_s=0.0, num_queued=int(q > 0)) for q in queues)
    return RouteQuery(prompt_len=prompt_len, device_lens=device, store_len=store_len,
                      loads=loads, page_size=512)


# Node 0 holds 8192 of 8292 tokens and is busy for 0.5 s; node 1 holds nothing and is idle.
# Recompute on node 1: 0.005 + 8292 x 1e-4 = 0.8342 s; node 0: 0.5 + 0.005 + 100 x 1e-4 = 0.515.
# Loading 8192 tokens (1,073,741,824 B): 10 GB/s -> 0.01 + 0.10737 s; 1 GB/s -> 0.01 + 1.0737 s.
BUSY_HOLDER = query((8192, 0), (0.5, 0.0), store_len=8192)


def test_device_prefix_prefers_the_holder() -> None:
    """device_prefix: 0.515 s on the busy holder beats 0.8342 s recomputing on the idle node,
    even though the store could restore the prefix on the idle node."""
    d = make_policy("device_prefix").choose(BUSY_HOLDER, est(store_gbps=10))
    assert d.node == 0 and d.plan.ttft_s == pytest.approx(0.515)


def test_radixlink_loads_on_the_idle_node_when_the_store_is_fast() -> None:
    """radixlink at 10 GB/s: 0.11737 s load + 0.015 s for the last 100 tokens on the idle
    node (0.13237 s) beats 0.515 s on the holder; at 1 GB/s (1.0837 s + 0.015 s) it does
    not, and the holder wins as for device_prefix."""
    fast = make_policy("radixlink").choose(BUSY_HOLDER, est(store_gbps=10))
    assert fast.node == 1 and fast.plan.source.value == "store"
    assert fast.plan.ttft_s == pytest.approx(0.01 + 8192 * BPT / 10e9 + 0.005 + 100e-4)
    slow = make_policy("radixlink").choose(BUSY_HOLDER, est(store_gbps=1))
    assert slow.node == 0 and slow.plan.ttft_s == pytest.approx(0.515)


def test_mooncake_copies_from_a_peer_device() -> None:
    """mooncake knows other nodes' devices: with a 40 GB/s peer path the idle node copies
    node 0's 8192 tokens (0.01 + 0.02684 s) and wins; without a peer path it cannot."""
    d = make_policy("mooncake").choose(BUSY_HOLDER, est(peer_gbps=40))
    assert d.node == 1 and d.plan.source.value == "peer"
    assert d.plan.ttft_s == pytest.approx(0.01 + 8192 * BPT / 40e9 + 0.015)
    assert make_policy("mooncake").choose(BUSY_HOLDER, est()).node == 0


def test_load_blind_policies() -> None:
    """round_robin cycles whatever the load; least_loaded takes the smallest queue and breaks
    ties by turning round the nodes."""
    rr = make_policy("round_robin")
    q = query((0, 0, 0), (5.0, 0.0, 0.0))
    assert [rr.choose(q, est()).node for _ in range(4)] == [0, 1, 2, 0]
    ll = make_policy("least_loaded")
    assert ll.choose(BUSY_HOLDER, est()).node == 1
    idle = query((0, 0, 0), (0.0, 0.0, 0.0))
    assert [ll.choose(idle, est()).node for _ in range(4)] == [0, 1, 2, 0]


def test_every_policy_is_registered_and_unknown_names_fail() -> None:
    """The five policies are registered; an unknown one is a ValueError naming them."""
    assert list(POLICIES) == ["round_robin", "least_loaded", "device_prefix", "mooncake",
                              "radixlink"]
    with pytest.raises(ValueError, match="round_robin, least_loaded"):
        make_policy("fastest")
    with pytest.raises(ValueError, match="one load per node"):
        RouteQuery(prompt_len=1, device_lens=(0,), store_len=0, loads=())


def test_queue_book() -> None:
    """Queued estimates add up; a running request counts down from its start; finishing
    removes it; transfers on one link run one after another."""
    book = QueueBook(2)
    book.add(0, "a", 2.0)
    book.add(0, "b", 1.0)
    assert book.load(0, now=10.0) == NodeLoad(queue_s=3.0, link_s=0.0, num_queued=2,
                                              waiting=(Waiting(2.0), Waiting(1.0)))
    book.start("a", now=10.0)
    assert book.load(0, now=10.5).queue_s == pytest.approx(2.5)
    assert book.load(0, now=13.0).queue_s == pytest.approx(1.0)  # overdue: never negative
    book.finish("a")
    book.finish("b")
    book.finish("missing")
    assert book.load(0, now=13.0) == NodeLoad(queue_s=0.0, link_s=0.0, num_queued=0)
    assert book.add_transfer(1, 0.5, now=1.0) == 1.5
    assert book.add_transfer(1, 0.5, now=1.2) == 2.0
    assert book.load(1, now=1.2).link_s == pytest.approx(0.8)
    with pytest.raises(ValueError, match="already in flight"):
        book.add(0, "c", 1.0)
        book.add(0, "c", 1.0)


def test_a_request_started_at_time_zero_counts_down_too() -> None:
    """A clock that starts at 0 (the cluster simulation's): the first request, started at 0.0,
    counts down like any other (it was counted as just started, forever)."""
    book = QueueBook(1)
    book.add(0, "first", 0.9)
    book.start("first", now=0.0)
    assert book.load(0, now=0.6).queue_s == pytest.approx(0.3)


def test_queue_book_knows_what_waits_on_a_transfer() -> None:
    """A request booked with the end of its transfers is waiting on them until then; a
    started one is running, not waiting."""
    book = QueueBook(1)
    book.add(0, "loading", 0.1, ready_at=10.3)
    book.add(0, "ready", 0.2)
    load = book.load(0, now=10.0)
    assert [w.est_s for w in load.waiting] == [0.1, 0.2]
    assert load.waiting[0].ready_in_s == pytest.approx(0.3) and load.waiting[1].ready_in_s == 0
    book.start("ready", now=10.0)
    load = book.load(0, now=10.1)
    assert load.running_s == pytest.approx(0.1) and len(load.waiting) == 1
    assert load.waiting[0].ready_in_s == pytest.approx(0.2)
    for bad in ({"est_s": float("nan")}, {"ready_at": float("nan")},
                {"ready_at": float("inf")}):
        with pytest.raises(ValueError, match="finite ready time"):
            book.add(0, "bad", **{"est_s": 1.0, **bad})
    assert len(book.load(0, now=10.1).waiting) == 1  # nothing was booked


def test_place_replays_the_order_a_node_serves() -> None:
    """Node idle, one request (0.1 s) loading until 0.3 s. A ready 0.8342 s prefill starts at
    once and ends at 0.8342: the loading one starts then, 0.5342 s late. A 0.2 s one ends
    before the load does (no delay). One whose own load ends at 0.5 s goes behind. With
    nothing loading it is arrival order: it starts after the queue and delays nobody."""
    loading = NodeLoad(queue_s=0.1, link_s=0.0, num_queued=1, waiting=(Waiting(0.1, 0.3),))
    assert place(loading, 0.8342, 0.0) == Placement(start_in_s=0.0,
                                                    overtake_s=pytest.approx(0.5342))
    assert place(loading, 0.2, 0.0) == Placement(start_in_s=0.0, overtake_s=0.0)
    assert place(loading, 0.8342, 0.5) == Placement(start_in_s=0.5, overtake_s=0.0)
    ready = NodeLoad(queue_s=0.1, link_s=0.0, num_queued=1, waiting=(Waiting(0.1),))
    assert place(ready, 0.8342, 0.0) == Placement(start_in_s=0.1, overtake_s=0.0)
    with pytest.raises(ValueError, match="finite seconds"):
        Waiting(0.1, float("nan"))


def loading_vs_running(*, prompt_len: int, waiting_s: float,
                       running_s: float) -> tuple[Decision, Decision]:
    """device_prefix's and radixlink's choice for a prompt no tier holds, between node 0 (device
    free, one ``waiting_s`` request loading until 0.3 s) and node 1 (running ``running_s``)."""
    loads = (NodeLoad(queue_s=waiting_s, link_s=0.0, num_queued=1,
                      waiting=(Waiting(waiting_s, 0.3),)),
             NodeLoad(queue_s=running_s, link_s=0.0, num_queued=1, running_s=running_s))
    q = RouteQuery(prompt_len=prompt_len, device_lens=(0, 0), store_len=0, loads=loads,
                   page_size=512)
    return (make_policy("device_prefix").choose(q, est(store_gbps=10)),
            make_policy("radixlink").choose(q, est(store_gbps=10)))


def test_radixlink_keeps_a_long_prefill_off_a_node_whose_request_is_loading() -> None:
    """A prompt of 8292 tokens that no tier holds (0.8342 s to recompute). Node 0's device is
    free but a 0.1 s request there waits on its load until 0.3 s; node 1 runs one for 0.5 s
    more. device_prefix counts queues only: node 0 (0.1 + 0.8342) beats node 1 (1.3342), and
    the new prefill then runs ahead of the loaded request and delays it by 0.5342 s.
    radixlink sees that it would start at once on node 0 (0.8342 s) but adds that delay
    (1.3684 s), and takes node 1."""
    dp, rl = loading_vs_running(prompt_len=8292, waiting_s=0.1, running_s=0.5)
    assert dp.node == 0
    assert rl.node == 1 and rl.plan.ttft_s == pytest.approx(1.3342)


def test_radixlink_fills_the_gap_before_a_load_ends() -> None:
    """A 1950-token prompt (0.2 s of prefill) that no tier holds. Node 0's device is free; its
    one queued request (0.5 s) waits on a load until 0.3 s. Node 1 runs one for 0.25 s more.
    device_prefix counts node 0's queue (0.7 s) and takes node 1 (0.45 s); radixlink sees the
    request would start at once on node 0 and end before the load does: 0.2 s, no delay."""
    dp, rl = loading_vs_running(prompt_len=1950, waiting_s=0.5, running_s=0.25)
    assert dp.node == 1
    assert rl.node == 0 and rl.plan.ttft_s == pytest.approx(0.2)


def test_router_routes_by_real_kv_events() -> None:
    """A Router fed the KV events of two real caches: after node 1 served a prompt, the
    device_prefix policy sends the next turn of it to node 1 (its device holds 8 pages)."""
    caches = []
    for i in range(2):
        cache = UnifiedCache(CacheConfig(page_size=4, num_tokens=256,
                                         enable_external_cache_linker=True))
        cache.enable_kv_events(KVEventQueue(node_id=str(i)))
        caches.append(cache)
    prompt = list(range(1, 35))  # 8 whole pages and 2 tokens
    m = caches[1].match_prefix(prompt)
    slots = caches[1].alloc(len(prompt))
    assert slots is not None and m.prefix_len == 0
    caches[1].insert(InsertParams(key=prompt, value=slots[:32]))
    caches[1].free(slots[32:])
    router = Router("device_prefix", ["0", "1"], EstimateTracker(est()), page_size=4)
    for cache in caches:
        router.ingest(cache.kv_events.drain())
    turn = prompt + [7, 7, 7, 7, 7, 7]
    hashes = page_hashes(turn, 4)
    q = router.query(hashes, len(turn), now=0.0)
    assert q.device_lens == (0, 32) and q.store_len == 0
    assert router.route(hashes, len(turn), now=0.0).node == 1
    router.book(1, "t1", 2.0)  # node 1 now has 2 s queued: recomputing 40 tokens on 0 wins
    assert router.route(hashes, len(turn), now=0.0).node == 0
    with pytest.raises(ValueError, match="exceed"):
        router.query(hashes, 3, now=0.0)
    assert torch.equal(caches[1].match_prefix(turn).device_indices[:32], slots[:32])


def test_router_expects_the_pages_of_requests_in_flight() -> None:
    """Pages booked with a request count on its node (``expected_lens``) once its transfers
    should have ended, and no more once it finishes; radixlink then sends a twin behind it,
    device_prefix (events only) does not see them."""
    router = Router("radixlink", ["0", "1"], EstimateTracker(est()), page_size=4)
    prompt = list(range(1, 4003))  # 1,000 whole pages and 2 tokens
    hashes = page_hashes(prompt, 4)
    router.book(0, "ready", 0.05, hashes=hashes[:4])
    router.book(1, "loading", 0.1, ready_at=5.0, hashes=hashes)
    assert router.query(hashes, len(prompt), now=1.0).expected_lens == (16, 0)
    assert router.query(hashes, len(prompt), now=5.0).expected_lens == (16, 4000)
    # node 1: 0.1 s queued + 2 tokens (0.105 s); node 0: 0.05 s + 3,986 tokens (0.454 s)
    assert router.route(hashes, len(prompt), now=5.0).node == 1
    assert make_policy("device_prefix").choose(router.query(hashes, len(prompt), now=5.0),
                                               router.estimates).plan.device_len == 0
    router.finish("loading")
    router.finish("ready")
    router.finish("unknown")
    assert router.query(hashes, len(prompt), now=6.0).expected_lens == (0, 0)
    assert router.index.stats()["expected_pages"] == 0
    with pytest.raises(ValueError, match="expected length per node"):
        RouteQuery(prompt_len=1, device_lens=(0, 0), store_len=0, loads=BUSY_HOLDER.loads,
                   expected_lens=(0,))
