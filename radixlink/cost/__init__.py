"""The store-aware cost model: expected time to first token per way of getting a prefix, the
load-vs-recompute choice, and moving estimates of bandwidths and prefill speed (docs/routing.md).

Re-exports only.
"""

from radixlink.cost.estimates import Estimates, PrefillEstimate, TransferEstimate
from radixlink.cost.reference import (
    H100_SXM,
    LLAMA3_8B,
    TIERS,
    GpuSpec,
    ModelShape,
    prefill_estimate,
)
from radixlink.cost.tracking import DecayedFit, EstimateTracker
from radixlink.cost.ttft import (
    HIDE,
    Offer,
    Plan,
    Source,
    break_even_bytes_per_s,
    choose_load_pages,
    plan_ttft,
    prefill_rest_s,
)

__all__ = [
    "HIDE",
    "H100_SXM",
    "LLAMA3_8B",
    "TIERS",
    "DecayedFit",
    "EstimateTracker",
    "Estimates",
    "GpuSpec",
    "ModelShape",
    "Offer",
    "Plan",
    "PrefillEstimate",
    "Source",
    "TransferEstimate",
    "break_even_bytes_per_s",
    "choose_load_pages",
    "plan_ttft",
    "prefill_estimate",
    "prefill_rest_s",
]
