"""Metrics and plots of `radixlink bench cluster`: per (store tier, rate, policy) one row of TTFT
percentiles, SLO attainment, goodput, prefill saved and bytes moved; TTFT CDFs and attainment
vs request rate.

Owns the metric definitions (docs/routing.md, "Metrics"). Reads ``SimResult``s only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from radixlink.bench.cluster_sim import SimResult


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else float("nan")


def summarize(res: SimResult, *, slo_s: float, tier: str) -> dict[str, Any]:
    """One row: the run's configuration, TTFT p50/p90/p99 (s), SLO attainment (share of
    requests with TTFT <= ``slo_s``), goodput (those requests per second of the trace's
    arrival span), prefill tokens saved, tokens per source, GB moved, and the same TTFT
    figures over the requests whose prefix the store held beyond every device."""
    cfg, ttft, c = res.config, res.ttft_s, res.counts
    assert not np.isnan(ttft).any(), "a request never finished"
    span = float(res.arrival_s.max() - res.arrival_s.min()) if ttft.size > 1 else 1.0
    span = span or 1.0
    input_tokens = c["device_tokens"] + c["peer_tokens"] + c["store_tokens"] + c[
        "computed_tokens"]
    ok = ttft <= slo_s
    only = ttft[res.store_only]
    return {
        "store": tier, "rate_scale": cfg.rate_scale, "req_per_s": round(ttft.size / span, 3),
        "policy": cfg.policy, "node_loads": cfg.node_loads, "requests": int(ttft.size),
        "ttft_p50_s": _pct(ttft, 50), "ttft_p90_s": _pct(ttft, 90), "ttft_p99_s": _pct(ttft, 99),
        "ttft_mean_s": float(ttft.mean()), "slo_s": slo_s,
        "slo_attainment": float(ok.mean()), "goodput_rps": float(ok.sum() / span),
        "input_tokens": input_tokens, "computed_tokens": c["computed_tokens"],
        "prefill_saved": 1.0 - c["computed_tokens"] / max(input_tokens, 1),
        "device_tokens": c["device_tokens"], "store_tokens": c["store_tokens"],
        "peer_tokens": c["peer_tokens"], "declined_store_tokens": c["declined_store_tokens"],
        "load_gb": c["store_bytes"] / 1e9, "peer_gb": c["peer_bytes"] / 1e9,
        "offload_gb": c["offload_bytes"] / 1e9,
        "store_only_requests": int(only.size), "store_only_p50_s": _pct(only, 50),
        "store_only_p99_s": _pct(only, 99),
        "store_only_attainment": float((only <= slo_s).mean()) if only.size else float("nan"),
        "utilization": c["busy_us"] / 1e6 / (span * cfg.num_nodes),
        "truncated_prompts": c["truncated_prompts"],
        "store_evicted_pages": c["store_evicted_pages"],
    }


def aggregate(cell: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One row for a (tier, rate, policy) cell run under several seeds: numbers are means;
    p99, attainment and store-only p99 also get their min and max."""
    out = dict(cell[0])
    for key, value in cell[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(np.nanmean([r[key] for r in cell])) if len(cell) > 1 else value
    for key in ("ttft_p99_s", "slo_attainment", "store_only_p99_s"):
        out[f"{key}_min"] = min(r[key] for r in cell)
        out[f"{key}_max"] = max(r[key] for r in cell)
    out["seeds"] = [r.get("seed") for r in cell]
    out.pop("seed", None)
    return out


P99_TOLERANCE = 0.005
"""The p99 margin within which radixlink counts as no worse than a baseline."""


def verdicts(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (tier, rate): radixlink's SLO attainment and p99 TTFT against the best baseline,
    and its store-only TTFT against device_prefix. "At least as good": attainment at least
    the best baseline's and p99 within ``P99_TOLERANCE`` of the best (a p99 of a few thousand
    requests moves by about that between seeds)."""
    out = []
    cells = dict.fromkeys((r["store"], r["rate_scale"]) for r in rows)
    for tier, rate in cells:
        here = [r for r in rows if r["store"] == tier and r["rate_scale"] == rate]
        mine = next((r for r in here if r["policy"] == "radixlink"), None)
        others = [r for r in here if r["policy"] != "radixlink"]
        if mine is None or not others:
            continue
        best_slo = max(others, key=lambda r: r["slo_attainment"])
        best_p99 = min(others, key=lambda r: r["ttft_p99_s"])
        dp = next((r for r in others if r["policy"] == "device_prefix"), None)
        row = {"store": tier, "x rate": rate,
               "SLO radixlink": round(mine["slo_attainment"], 4),
               "best baseline SLO": f"{best_slo['slo_attainment']:.4f} ({best_slo['policy']})",
               "p99 radixlink": round(mine["ttft_p99_s"], 3),
               "best baseline p99": f"{best_p99['ttft_p99_s']:.3f} ({best_p99['policy']})",
               "at least as good": mine["slo_attainment"] >= best_slo["slo_attainment"]
               and mine["ttft_p99_s"] <= best_p99["ttft_p99_s"] * (1 + P99_TOLERANCE)}
        if dp is not None and dp["store_only_requests"]:
            row.update({
                "store-only p99 vs device_prefix": f"{mine['store_only_p99_s']:.3f} vs "
                                                   f"{dp['store_only_p99_s']:.3f}",
                "store-only SLO vs device_prefix": f"{mine['store_only_attainment']:.4f} vs "
                                                   f"{dp['store_only_attainment']:.4f}"})
        out.append(row)
    return out


def table_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The printed columns."""
    return [{
        "store": r["store"], "x rate": r["rate_scale"], "req/s": r["req_per_s"],
        "policy": r["policy"], "loads": r["node_loads"], "util": round(r["utilization"], 3),
        "TTFT p50": round(r["ttft_p50_s"], 3), "TTFT p99": round(r["ttft_p99_s"], 3),
        "p99 range": f"{r.get('ttft_p99_s_min', r['ttft_p99_s']):.2f}-"
                     f"{r.get('ttft_p99_s_max', r['ttft_p99_s']):.2f}",
        "SLO att.": round(r["slo_attainment"], 4), "goodput/s": round(r["goodput_rps"], 3),
        "saved": round(r["prefill_saved"], 4), "dev Mtok": round(r["device_tokens"] / 1e6, 2),
        "store Mtok": round(r["store_tokens"] / 1e6, 2),
        "peer Mtok": round(r["peer_tokens"] / 1e6, 2),
        "declined Mtok": round(r["declined_store_tokens"] / 1e6, 2),
        "load GB": round(r["load_gb"], 1), "offload GB": round(r["offload_gb"], 1),
        "store-only n": round(r["store_only_requests"]),
        "store-only p99": round(r["store_only_p99_s"], 3),
        "store-only SLO": round(r["store_only_attainment"], 4),
    } for r in rows]


def plot(rows: Sequence[dict[str, Any]], ttfts: dict[tuple[str, float, str], np.ndarray],
         prefix: str, title: str) -> list[str]:
    """``<prefix>_cdf.png`` (TTFT CDF per policy; one panel per tier and rate) and
    ``<prefix>_attainment.png`` (SLO attainment vs request rate; one panel per tier).
    Returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tiers = list(dict.fromkeys(r["store"] for r in rows))
    rates = sorted({r["rate_scale"] for r in rows})
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    colors = {p: f"C{i}" for i, p in enumerate(policies)}
    fig, axes = plt.subplots(len(tiers), len(rates), figsize=(4.2 * len(rates),
                             3.4 * len(tiers)), squeeze=False, sharey=True)
    for ti, tier in enumerate(tiers):
        for ri, rate in enumerate(rates):
            ax = axes[ti][ri]
            for p in policies:
                values = ttfts.get((tier, rate, p))
                if values is None or not values.size:
                    continue
                xs = np.sort(values)
                ax.plot(xs, np.arange(1, xs.size + 1) / xs.size, color=colors[p], label=p)
            req_s = next((r["req_per_s"] for r in rows if r["store"] == tier
                          and r["rate_scale"] == rate), 0.0)
            ax.set_xscale("log")
            ax.set_title(f"store {tier}, x{rate:g} ({req_s:.1f} req/s)", fontsize=9)
            ax.set_xlabel("TTFT (s)")
            ax.grid(True, which="both", alpha=0.3)
        axes[ti][0].set_ylabel("share of requests")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    cdf = f"{prefix}_cdf.png"
    fig.savefig(cdf, dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(1, len(tiers), figsize=(5 * len(tiers), 3.8), squeeze=False)
    for ti, tier in enumerate(tiers):
        ax = axes[0][ti]
        for p in policies:
            pts = sorted((r["req_per_s"], r["slo_attainment"]) for r in rows
                         if r["store"] == tier and r["policy"] == p)
            if pts:
                ax.plot(*zip(*pts), "-o", color=colors[p], label=p)
        slo = rows[0]["slo_s"] if rows else 0
        ax.set_title(f"store {tier}: TTFT <= {slo:g} s", fontsize=9)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("SLO attainment")
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    att = f"{prefix}_attainment.png"
    fig.savefig(att, dpi=110)
    plt.close(fig)
    return [cdf, att]
