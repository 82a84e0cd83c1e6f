"""The discrete-event simulation behind `radixlink bench cluster`: a timed trace over N nodes, each
a real ``UnifiedCache`` (index only) sharing one real ``MemoryStore`` (presence only), routed
by a real ``Router`` from the nodes' KV events; compute, queueing and transfers are timed by
the ``Timing`` model (docs/routing.md, "Cluster simulation").

Owns the event loop and per-request accounting. Must not change the policies or the cost model.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from radixlink.bench.cluster_node import Job, SimNode
from radixlink.bench.cluster_trace import TimedRequest, prompt_tokens
from radixlink.contract import PoolName
from radixlink.cost import (
    HIDE,
    Estimates,
    EstimateTracker,
    Offer,
    PrefillEstimate,
    Source,
    TransferEstimate,
    plan_ttft,
    prefill_rest_s,
)
from radixlink.hashing import namespace_id
from radixlink.routing import Router
from radixlink.stores import open_store, page_key

_ARRIVE, _READY, _DONE, _OFFLOADED = range(4)


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """The simulated hardware: what things really take (policies only estimate it).

    Attributes:
        prefill: prefill time per pass.
        bytes_per_token: KV bytes per token.
        store: store -> device path; None = no store.
        peer: device -> device path between nodes; None = none.
        offload: device -> store path (None = the store's path).
        noise: sigma of a mean-one log-normal factor on every prefill and transfer.
    """

    prefill: PrefillEstimate
    bytes_per_token: int
    store: TransferEstimate | None = None
    peer: TransferEstimate | None = None
    offload: TransferEstimate | None = None
    noise: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    """One simulated run.

    Attributes:
        policy: routing policy name.
        num_nodes: prefill nodes.
        page_size: tokens per page (cache, hashes, store).
        block_size: tokens per trace hash id.
        device_tokens: device KV capacity per node.
        store_tokens: store capacity in tokens (LRU), None = unbounded.
        timing: the hardware.
        rate_scale: arrivals are sped up by this factor (timestamps / rate_scale).
        node_loads: ``cost`` (the node loads what the cost model picks) or ``always`` (the
            node loads everything restorable, as engines do without a cost model).
        prior_scale: the estimates start with prefill and transfer times x this (1 = right).
        seed: seeds the noise.
        hash_algo: page hash function.
        hide: share of a node's queue the cost model lets a load hide behind.
    """

    policy: str
    timing: Timing
    num_nodes: int = 8
    page_size: int = 512
    block_size: int = 512
    device_tokens: int = 400 * 1024
    store_tokens: int | None = None
    rate_scale: float = 1.0
    node_loads: str = "always"
    prior_scale: float = 1.0
    seed: int = 0
    hash_algo: str = "xxh3"
    hide: float = HIDE

    def __post_init__(self) -> None:
        if self.num_nodes <= 0 or self.rate_scale <= 0 or self.prior_scale <= 0:
            raise ValueError(f"num_nodes, rate_scale and prior_scale must be positive, got "
                             f"{self.num_nodes}, {self.rate_scale}, {self.prior_scale}")
        if self.device_tokens < self.page_size or self.device_tokens % self.page_size:
            raise ValueError(f"device_tokens={self.device_tokens} must be a positive multiple "
                             f"of page_size={self.page_size}")
        if not 0 <= self.hide <= 1:
            raise ValueError(f"hide must be in [0, 1], got {self.hide}")
        if self.node_loads not in ("cost", "always"):
            raise ValueError(f"node_loads must be 'cost' or 'always', got {self.node_loads!r}")

    def prior(self) -> Estimates:
        """What the router and nodes believe at the start: the timing x ``prior_scale``."""
        t, k = self.timing, self.prior_scale

        def path(p: TransferEstimate | None) -> TransferEstimate | None:
            return None if p is None else TransferEstimate(bytes_per_s=p.bytes_per_s / k,
                                                           latency_s=p.latency_s * k)

        pf = t.prefill
        return Estimates(prefill=PrefillEstimate(token_s=pf.token_s * k, pair_s=pf.pair_s * k,
                                                 overhead_s=pf.overhead_s * k),
                         bytes_per_token=t.bytes_per_token, store=path(t.store),
                         peer=path(t.peer))


@dataclass(slots=True)
class SimResult:
    """Per request (trace order) and totals of one run."""

    config: ClusterConfig
    arrival_s: np.ndarray
    ttft_s: np.ndarray
    store_only: np.ndarray  # the store held a longer prefix than any device at routing time
    counts: Counter[str]


def _noise(n: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    if sigma <= 0:
        return np.ones(n)
    return np.exp(rng.normal(-sigma * sigma / 2, sigma, n))


class _Run:
    """State of one simulation (see ``simulate``)."""

    def __init__(self, requests: Sequence[TimedRequest], hashes: Sequence[Sequence[str]],
                 cfg: ClusterConfig):
        self.requests, self.hashes, self.cfg = requests, hashes, cfg
        t = cfg.timing
        self.nodes = [SimNode(i, page_size=cfg.page_size, device_tokens=cfg.device_tokens,
                              hash_algo=cfg.hash_algo) for i in range(cfg.num_nodes)]
        self.store = None
        if t.store is not None:
            pages = (1 << 62) if cfg.store_tokens is None else max(1, cfg.store_tokens
                                                                    // cfg.page_size)
            self.store = open_store(f"memory://?capacity={pages}")  # NOTE: 1 byte per page
        self.ns = namespace_id(None)
        self.tracker = EstimateTracker(cfg.prior(), typical_tokens=8192)
        self.router = Router(cfg.policy, [str(i) for i in range(cfg.num_nodes)], self.tracker,
                             page_size=cfg.page_size, store_prefix=self._store_pages,
                             hide=cfg.hide)
        rng = np.random.default_rng(cfg.seed)
        n = len(requests)
        self.prefill_noise = _noise(n, t.noise, rng)
        self.load_noise = _noise(n, t.noise, rng)
        self.ttft = np.full(n, np.nan)
        self.store_only = np.zeros(n, dtype=bool)
        self.counts: Counter[str] = Counter()
        self.inflight: set[str] = set()
        self.heap: list[tuple[float, int, int, Any]] = [
            (r.arrival_s / cfg.rate_scale, i, _ARRIVE, i) for i, r in enumerate(requests)]
        heapq.heapify(self.heap)
        self.seq = n

    # ------------------------------------------------------------------ store helpers

    def _keys(self, hashes: Sequence[str]) -> list[str]:
        return [page_key(self.ns, h, PoolName.KV) for h in hashes]

    def _store_pages(self, hashes: Sequence[str]) -> int:
        """Leading pages of ``hashes`` the store holds (one batched presence query)."""
        if self.store is None or not hashes:
            return 0
        exists = self.store.exists(self._keys(hashes))
        return exists.index(False) if False in exists else len(exists)

    def push(self, when: float, kind: int, payload: Any) -> None:
        heapq.heappush(self.heap, (when, self.seq, kind, payload))
        self.seq += 1

    # ------------------------------------------------------------------ events

    def arrive(self, i: int, now: float) -> None:
        req, hashes, ps = self.requests[i], self.hashes[i], self.cfg.page_size
        query = self.router.query(hashes, req.input_len, now)
        self.store_only[i] = query.store_len > max(query.device_lens)
        decision = self.router.policy.choose(query, self.router.estimates)
        node = self.nodes[decision.node]
        key = prompt_tokens(req, self.cfg.block_size)[: node.capacity]
        job = Job(req=i, node=decision.node, arrival_s=now, prompt_len=req.input_len, key=key)
        node.arrive(job)
        est = self.router.estimates
        whole = len(key) // ps
        store_len = job.device_len + ps * self._store_pages(hashes[job.device_len // ps:whole])
        peer_len = decision.plan.prefix_len if decision.plan.source is Source.PEER else 0
        peer_len = min(peer_len, whole * ps)
        self._plan_loads(job, est, peer_len, store_len, now)
        # NOTE: the node matches again when it starts the job (as engine schedulers do), so
        # what requests ahead of it there will have computed counts too
        ahead = min(query.expected_lens[decision.node], whole * ps)
        job.est_s = prefill_rest_s(est.prefill, req.input_len, max(job.prefix_len, ahead))
        ready, expected = self._start_transfers(node, job, est, now)
        self.router.book(decision.node, i, job.est_s, ready_at=expected,
                         hashes=hashes[:whole])
        self.counts["device_tokens"] += job.device_len
        self.counts["declined_store_tokens"] += max(0, store_len - job.prefix_len)
        self.push(ready, _READY, job)

    def _plan_loads(self, job: Job, est: Estimates, peer_len: int, store_len: int,
                    now: float) -> None:
        dev = job.device_len
        if self.cfg.node_loads == "always":
            job.peer_tokens = max(0, peer_len - dev)
            job.store_tokens = max(0, store_len - max(dev, peer_len))
            return
        offers = []
        if est.peer is not None and peer_len > dev:
            offers.append(Offer(source=Source.PEER, lengths=(peer_len,), transfer=est.peer,
                                step=self.cfg.page_size))
        if est.store is not None and store_len > dev:
            offers.append(Offer(source=Source.STORE, lengths=(store_len,), transfer=est.store,
                                step=self.cfg.page_size))
        load = self.router.queues.load(job.node, now)
        plan = plan_ttft(prompt_len=job.prompt_len, device_len=dev, offers=offers,
                         estimates=est, queue_s=load.queue_s, link_s=load.link_s,
                         hide=self.cfg.hide, behind=load.behind)
        if plan.source is Source.PEER:
            job.peer_tokens = plan.load_len
        elif plan.source is Source.STORE:
            job.store_tokens = plan.load_len

    def _start_transfers(self, node: SimNode, job: Job, est: Estimates,
                         now: float) -> tuple[float, float]:
        """Queue the job's transfers on its node's link; returns when the job is ready, and
        when the router expects it to be."""
        t, bpt, ready, expected = self.cfg.timing, self.cfg.timing.bytes_per_token, now, now
        parts = ((Source.PEER, job.peer_tokens, t.peer, est.peer),
                 (Source.STORE, job.store_tokens, t.store, est.store))
        for source, tokens, path, guess in parts:
            if tokens <= 0 or path is None or guess is None:
                continue
            nbytes = tokens * bpt
            seconds = path.seconds(nbytes) * self.load_noise[job.req]
            ready = node.transfer(now, seconds)
            expected = self.router.queues.add_transfer(job.node, guess.seconds(nbytes), now)
            job.observed.append((source, nbytes, seconds))
            self.counts[f"{source.value}_tokens"] += tokens
            self.counts[f"{source.value}_bytes"] += nbytes
            if source is Source.STORE:
                assert self.store is not None
                ps, first = self.cfg.page_size, job.device_len + job.peer_tokens
                keys = self._keys(self.hashes[job.req][first // ps:(first + tokens) // ps])
                got = self.store.get(keys)  # NOTE: a read refreshes the pages' LRU position
                assert all(v is not None for v in got), "store lost pages within one instant"
        return ready, expected

    def ready(self, job: Job, now: float) -> None:
        for source, nbytes, seconds in job.observed:
            self.tracker.observe_load(source, nbytes, seconds)
        node = self.nodes[job.node]
        node.ready(job)
        self.start_next(node, now)

    def start_next(self, node: SimNode, now: float) -> None:
        job = node.next_job()
        if job is None:
            return
        self._ingest(node, now)
        self.router.start(job.req, now)
        seconds = (prefill_rest_s(self.cfg.timing.prefill, job.prompt_len, job.prefix_len)
                   * self.prefill_noise[job.req])
        self.counts["busy_us"] += int(seconds * 1e6)
        self.push(now + seconds, _DONE, (job, seconds))

    def done(self, job: Job, seconds: float, now: float) -> None:
        node = self.nodes[job.node]
        node.finish(job)
        self.ttft[job.req] = now - job.arrival_s
        cached = min(job.prefix_len, job.prompt_len - 1)
        self.tracker.observe_prefill(job.prompt_len - cached, cached, seconds)
        self.counts["computed_tokens"] += job.prompt_len - cached
        self.router.finish(job.req)
        self._ingest(node, now)
        self.start_next(node, now)

    def _ingest(self, node: SimNode, now: float) -> None:
        """The node's KV events go to the router; device pages new to the store are offloaded
        (write-through), landing after the outbound transfer."""
        events, stored = node.drain()
        self.router.ingest(events)
        path = self.cfg.timing.offload or self.cfg.timing.store
        if self.store is None or path is None or not stored:
            return
        fresh = [h for h in stored if h not in self.inflight]
        if not fresh:
            return
        exists = self.store.exists(self._keys(fresh))
        fresh = [h for h, there in zip(fresh, exists) if not there]
        if fresh:
            self.inflight.update(fresh)
            nbytes = len(fresh) * self.cfg.page_size * self.cfg.timing.bytes_per_token
            self.counts["offload_bytes"] += nbytes
            self.push(node.offload(now, path.seconds(nbytes)), _OFFLOADED, fresh)

    def offloaded(self, hashes: list[str]) -> None:
        assert self.store is not None
        self.store.put({k: b"\x01" for k in self._keys(hashes)})
        self.inflight.difference_update(hashes)

    def run(self) -> SimResult:
        while self.heap:
            now, _, kind, payload = heapq.heappop(self.heap)
            if kind == _ARRIVE:
                self.arrive(payload, now)
            elif kind == _READY:
                self.ready(payload, now)
            elif kind == _DONE:
                self.done(payload[0], payload[1], now)
            else:
                self.offloaded(payload)
        for node in self.nodes:
            node.check_idle()
            self.counts["truncated_prompts"] += node.truncated
            self.counts["rematched_tokens"] += node.rematched_tokens
        if self.store is not None:
            self.counts["store_evicted_pages"] = int(self.store.stats().get("evicted", 0))
            self.store.close()
        arrivals = np.array([r.arrival_s / self.cfg.rate_scale for r in self.requests])
        return SimResult(self.cfg, arrivals, self.ttft, self.store_only, self.counts)


def simulate(requests: Sequence[TimedRequest], hashes: Sequence[Sequence[str]],
             cfg: ClusterConfig) -> SimResult:
    """Replay ``requests`` (with their page hashes, ``cluster_trace.request_hashes``) on a
    simulated cluster; every request's TTFT and the run's totals.

    Raises:
        ValueError: hashes that do not match the requests.
    """
    if len(hashes) != len(requests):
        raise ValueError(f"{len(hashes)} hash lists for {len(requests)} requests")
    return _Run(requests, hashes, cfg).run()

