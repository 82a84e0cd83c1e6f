"""The cost model (radixlink.cost): transfer and prefill arithmetic, the load-vs-recompute
choice on both sides of a break-even point computed by hand, plan_ttft's candidates, and the
moving estimates converging from a wrong prior."""

from __future__ import annotations

import pytest

from radixlink.cost import (
    H100_SXM,
    LLAMA3_8B,
    Estimates,
    EstimateTracker,
    Offer,
    PrefillEstimate,
    Source,
    TransferEstimate,
    break_even_bytes_per_s,
    choose_load_pages,
    plan_ttft,
    prefill_estimate,
)

BPT = 131072  # Llama-3-8B bf16: 32 layers x 8 KV heads x 128 dim x K,V x 2 bytes
PREFILL = PrefillEstimate(token_s=1e-4, overhead_s=0.005)  # 10,000 tokens/s, no attention term


def estimates(bytes_per_s: float, latency_s: float = 0.01,
              prefill: PrefillEstimate = PREFILL) -> Estimates:
    return Estimates(prefill=prefill, bytes_per_token=BPT,
                     store=TransferEstimate(bytes_per_s=bytes_per_s, latency_s=latency_s))


def test_break_even_point_by_hand() -> None:
    """8 pages of 512 tokens at 128 KiB/token with 10 ms latency vs 10k tokens/s: below
    536870912 / (0.4096 - 0.01) = 1,343,520,801 B/s the store is declined, above it loaded."""
    # recompute: 4096 tokens x 1e-4 s = 0.4096 s; load: 0.01 + 536,870,912 B / bandwidth
    hand = 536870912 / (4096 * 1e-4 - 0.01)
    assert round(hand) == 1343520801
    assert break_even_bytes_per_s(device_len=0, num_tokens=4096, bytes_per_token=BPT,
                                  prefill=PREFILL, latency_s=0.01) == pytest.approx(hand)
    kw = {"device_len": 0, "page_size": 512, "bytes_per_token": BPT}
    # 1.30 GB/s: 0.01 + 0.41298 = 0.42298 s > 0.4096 s -> recompute
    assert choose_load_pages([8], estimates=estimates(1.30e9), **kw) == 0
    # 1.40 GB/s: 0.01 + 0.38348 = 0.39348 s < 0.4096 s -> load all 8 pages
    assert choose_load_pages([8], estimates=estimates(1.40e9), **kw) == 8
    assert choose_load_pages([8], estimates=estimates(hand * 0.999), **kw) == 0
    assert choose_load_pages([8], estimates=estimates(hand * 1.001), **kw) == 8


def test_break_even_counts_attention_after_the_device_prefix() -> None:
    """With an attention term, tokens deep in the context cost more to recompute: positions
    [1024, 2048) cost 1024 x 1e-4 + 1e-8 x sum(i+1) = 0.1024 + 0.01573376 s (by hand), so the
    same load wins after a 1024-token device prefix and loses at position 0."""
    prefill = PrefillEstimate(token_s=1e-4, pair_s=1e-8)
    assert prefill.span_s(1024, 2048) == pytest.approx(0.1024 + 1573376 * 1e-8)
    assert prefill.span_s(0, 1024) == pytest.approx(0.1024 + (1024 * 1025 // 2) * 1e-8)
    # 1024 tokens x 131072 B = 134,217,728 B; at 1.2 GB/s and no latency: 0.1118481 s
    est = estimates(1.2e9, latency_s=0.0, prefill=prefill)
    kw = {"page_size": 256, "bytes_per_token": BPT, "estimates": est}
    assert choose_load_pages([4], device_len=0, **kw) == 0  # 0.1118 > 0.1076 s
    assert choose_load_pages([4], device_len=1024, **kw) == 4  # 0.1118 < 0.1181 s


def test_exact_tie_and_no_store_estimate() -> None:
    """An exact tie loads nothing (fewer pages win ties); without a store estimate the largest
    restorable length is loaded (the linker's behaviour before the cost model)."""
    # 2-token pages, 1 B/token, 2 B/s: loading one page takes 1.0 s = computing 2 x 0.5 s
    tie = Estimates(prefill=PrefillEstimate(token_s=0.5), bytes_per_token=1,
                    store=TransferEstimate(bytes_per_s=2.0))
    assert choose_load_pages([1], device_len=0, page_size=2, bytes_per_token=1,
                             estimates=tie) == 0
    none = Estimates(prefill=PREFILL, bytes_per_token=BPT)
    assert choose_load_pages([5, 2], device_len=0, page_size=16, bytes_per_token=BPT,
                             estimates=none) == 5
    assert choose_load_pages([], device_len=0, page_size=16, bytes_per_token=BPT,
                             estimates=none) == 0


def test_choice_is_a_restorable_length_and_deterministic() -> None:
    """Sparse restorable sets: the answer is one of them (or 0), the same on every call."""
    est = estimates(20e9)
    kw = {"device_len": 512, "page_size": 512, "bytes_per_token": BPT, "estimates": est}
    picks = {choose_load_pages([7, 3, 12], **kw) for _ in range(5)}
    assert picks == {12}
    assert choose_load_pages([3, 7, 12], **kw) == 12


def store_offer(est: Estimates, length: int = 4096, step: int = 512) -> list[Offer]:
    assert est.store is not None
    return [Offer(source=Source.STORE, lengths=(length,), transfer=est.store, step=step)]


def test_idle_node_plan_matches_the_break_even_point() -> None:
    """With an idle device nothing hides a load: below break-even (1.30 GB/s) the plan
    recomputes, above (1.40 GB/s) it loads all 8 pages; TTFT = load + the rest, by hand."""
    slow, fast = estimates(1.30e9), estimates(1.40e9)
    plan = plan_ttft(prompt_len=4196, device_len=0, offers=store_offer(slow), estimates=slow)
    assert plan.source is Source.DEVICE and plan.load_len == 0
    assert plan.ttft_s == pytest.approx(0.005 + 4196 * 1e-4)
    plan = plan_ttft(prompt_len=4196, device_len=0, offers=store_offer(fast), estimates=fast)
    assert plan.source is Source.STORE and plan.prefix_len == 4096
    assert plan.ttft_s == pytest.approx(0.01 + 4096 * BPT / 1.40e9 + 0.005 + 100 * 1e-4)


def test_queued_node_loads_only_what_the_wait_hides() -> None:
    """A 0.5 GB/s tier (2.6x slower per token than recompute) behind a 0.4 s queue: half the
    wait (0.2 s) hides 0.01 s + 1 page (67,108,864 B / 0.5e9 = 0.134 s) but not 2, so the
    plan loads 1 of the 8 restorable pages: 0.4 + 0.005 + 3684 x 1e-4 = 0.7734 s, against
    0.8246 s recomputing and 1.2987 s loading all 8 (by hand)."""
    est = estimates(0.5e9)
    plan = plan_ttft(prompt_len=4196, device_len=0, offers=store_offer(est), estimates=est,
                     queue_s=0.4)
    assert plan.source is Source.STORE and plan.prefix_len == 512
    assert plan.ttft_s == pytest.approx(0.4 + 0.005 + 3684 * 1e-4)
    none = plan_ttft(prompt_len=4196, device_len=0, offers=store_offer(est), estimates=est,
                     queue_s=0.4, hide=0.0)
    assert none.source is Source.DEVICE and none.ttft_s == pytest.approx(0.4 + 0.4246)
    whole = plan_ttft(prompt_len=4196, device_len=0, offers=store_offer(est, step=0),
                      estimates=est, queue_s=0.4)
    assert whole.source is Source.DEVICE  # only the listed length: all 8 pages lose


def test_requests_behind_weigh_the_compute_a_load_saves() -> None:
    """The same 0.5 GB/s tier and 0.4 s queue: loading 1 page (TTFT 0.7734 s, 0.3734 s of
    prefill) against all 8 (TTFT 1.298741824 s, 0.015 s of prefill). With b requests behind,
    all 8 cost less once 1.298741824 + 0.015 b < 0.7734 + 0.3734 b, b > 1.4658 (by hand): one
    request behind keeps the 1-page plan, two load all 8. The plan reports its own TTFT."""
    est = estimates(0.5e9)
    kw = {"prompt_len": 4196, "device_len": 0, "offers": store_offer(est), "estimates": est,
          "queue_s": 0.4}
    one = plan_ttft(behind=1, **kw)
    assert one.prefix_len == 512 and one.ttft_s == pytest.approx(0.7734)
    two = plan_ttft(behind=2, **kw)
    assert two.source is Source.STORE and two.prefix_len == 4096
    assert two.ttft_s == pytest.approx(0.4 + 0.01 + 8 * 512 * BPT / 0.5e9 - 0.2 + 0.015)
    assert two.prefill_s == pytest.approx(0.015)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="behind"):
            plan_ttft(behind=bad, **kw)


def test_plan_weighs_sources_and_link_wait() -> None:
    """The faster of peer and store wins; a busy link beyond the queue delays a load; the
    last prompt token is always computed; ties keep the device prefix."""
    store = TransferEstimate(bytes_per_s=10e9)
    peer = TransferEstimate(bytes_per_s=40e9)
    est = Estimates(prefill=PREFILL, bytes_per_token=BPT, store=store, peer=peer)
    both = [Offer(source=Source.STORE, lengths=(8192,), transfer=store),
            Offer(source=Source.PEER, lengths=(8192,), transfer=peer)]
    plan = plan_ttft(prompt_len=8192, device_len=1024, offers=both, estimates=est)
    assert plan.source is Source.PEER and plan.load_len == 7168
    assert plan.prefill_s == pytest.approx(0.005 + 1e-4)  # one token recomputed
    busy = plan_ttft(prompt_len=8192, device_len=1024, offers=both, estimates=est,
                     queue_s=0.1, link_s=0.3)
    # queue 0.1 s, half of it counted as hiding: 0.1 + (0.3 + load - 0.05) + the last token
    assert busy.ttft_s == pytest.approx(0.1 + 0.3 + 7168 * BPT / 40e9 - 0.05 + 0.005 + 1e-4)
    assert plan_ttft(prompt_len=8192, device_len=8192, offers=both,
                     estimates=est).source is Source.DEVICE
    with pytest.raises(ValueError, match="device_len"):
        plan_ttft(prompt_len=10, device_len=11, offers=[], estimates=est)


def test_transfer_and_prefill_validation() -> None:
    """Bad estimates are a ValueError naming the field."""
    with pytest.raises(ValueError, match="bytes_per_s"):
        TransferEstimate(bytes_per_s=0)
    with pytest.raises(ValueError, match="token_s"):
        PrefillEstimate(token_s=-1.0)
    with pytest.raises(ValueError, match="bytes_per_token"):
        Estimates(prefill=PREFILL, bytes_per_token=0)
    with pytest.raises(ValueError, match="page_size"):
        choose_load_pages([1], device_len=0, page_size=0, bytes_per_token=1,
                          estimates=estimates(1e9))
    assert TransferEstimate(bytes_per_s=1e9, latency_s=0.5).seconds(0) == 0.0
    assert PREFILL.seconds(0, 100) == 0.0


def test_reference_model_numbers() -> None:
    """Llama-3-8B: 131,072 KV bytes per token; 2 x (8.03e9 - 2 x 128,256 x 4,096) GEMM FLOPs
    per token; 4 x 32 x 32 x 128 attention FLOPs per pair; on an H100 at 60% / 50% MFU."""
    assert LLAMA3_8B.kv_bytes_per_token == BPT
    assert LLAMA3_8B.gemm_flops_per_token == 2 * (8.03e9 - 2 * 128256 * 4096)
    assert LLAMA3_8B.attn_flops_per_pair == 4 * 32 * 32 * 128
    p = prefill_estimate(LLAMA3_8B, H100_SXM, gemm_mfu=0.6, attn_mfu=0.5, overhead_s=0.0)
    assert p.token_s == pytest.approx(13958653696 / (989.4e12 * 0.6))
    assert p.pair_s == pytest.approx(524288 / (989.4e12 * 0.5))
    with pytest.raises(ValueError, match="gemm_mfu"):
        prefill_estimate(LLAMA3_8B, H100_SXM, gemm_mfu=1.5)


def test_tracker_learns_the_truth_from_a_wrong_prior() -> None:
    """Noise-free observations of a known store path and prefill model move predictions that
    started 2x off to within 2% of the truth."""
    truth_store = TransferEstimate(bytes_per_s=8e9, latency_s=0.002)
    truth_prefill = PrefillEstimate(token_s=2e-5, pair_s=1e-9, overhead_s=0.004)
    prior = Estimates(prefill=PrefillEstimate(token_s=4e-5, pair_s=2e-9, overhead_s=0.008),
                      bytes_per_token=BPT,
                      store=TransferEstimate(bytes_per_s=4e9, latency_s=0.004))
    tracker = EstimateTracker(prior, typical_tokens=8192)
    assert tracker.snapshot() is prior
    for i in range(1000):
        tokens = 256 + (i * 997) % 16384
        cached = (i * 131) % 8192
        tracker.observe_load(Source.STORE, tokens * BPT, truth_store.seconds(tokens * BPT))
        tracker.observe_prefill(tokens, cached, truth_prefill.seconds(tokens, cached))
    est = tracker.snapshot()
    assert est.store is not None and est.peer is None and tracker.snapshot() is est
    for num_bytes in (512 * BPT, 4096 * BPT, 16384 * BPT):  # within the observed range
        assert est.store.seconds(num_bytes) == pytest.approx(truth_store.seconds(num_bytes),
                                                             rel=0.02)
    for new, cached in ((512, 0), (4096, 2048), (16384, 8192)):
        assert est.prefill.seconds(new, cached) == pytest.approx(
            truth_prefill.seconds(new, cached), rel=0.02)
    before = prior.prefill.seconds(4096, 2048) / truth_prefill.seconds(4096, 2048)
    assert before == pytest.approx(2.0)  # the prior really was 2x off


def test_tracker_reads_linker_stats_deltas() -> None:
    """Two linker stats snapshots: the change of loaded_bytes and of the load_seconds
    histogram's sum and count make one mean load per load."""
    prior = estimates(1e9, latency_s=0.0)
    tracker = EstimateTracker(prior, prior_weight=1e-6)
    before = {"loaded_bytes": 0, "load_seconds": {"sum": 0.0, "count": 0, "buckets": []}}
    total_bytes, total_s = 0, 0.0
    for k in range(1, 6):  # loads of k x 100 MB in k x 25 ms: 4 GB/s, no latency
        total_bytes, total_s = total_bytes + k * 100_000_000, total_s + k * 0.025
        after = {"loaded_bytes": total_bytes,
                 "load_seconds": {"sum": total_s, "count": k, "buckets": []}}
        tracker.observe_linker(before, after)
        before = after
    est = tracker.snapshot()
    assert est.store is not None and est.store.bytes_per_s == pytest.approx(4e9, rel=0.01)
