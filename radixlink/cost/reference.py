"""Reference hardware for priors and simulations: a model's shape, a GPU's peak, and the
prefill estimate they imply; named transfer paths. Sources are in docs/routing.md.

Owns these constants and the FLOP arithmetic. Pure data; nothing here measures anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlink.cost.estimates import PrefillEstimate, TransferEstimate


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """The numbers of a decoder-only transformer that set its prefill cost and KV size.

    Attributes:
        name: for reports.
        num_params: all parameters.
        vocab_size: embedding rows (input embedding and LM head are not per-token GEMMs of
            the prefill: the lookup is free, the head runs for the last token only).
        hidden_size: model width.
        num_layers: transformer layers.
        num_heads: query heads.
        num_kv_heads: key/value heads (grouped-query attention).
        head_dim: dimension per head.
        dtype_bytes: bytes per KV element.
    """

    name: str
    num_params: float
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def gemm_flops_per_token(self) -> float:
        """2 FLOPs per weight per token, embeddings and LM head excluded."""
        return 2.0 * (self.num_params - 2 * self.vocab_size * self.hidden_size)

    @property
    def attn_flops_per_pair(self) -> float:
        """QK^T and PV for one (query, key) pair, all heads and layers: 2 x 2 x heads x dim."""
        return 4.0 * self.num_layers * self.num_heads * self.head_dim


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """Peak dense throughput of one accelerator.

    Attributes:
        name: for reports.
        peak_flops: dense BF16 tensor-core FLOP/s.
        memory_bytes: device memory.
    """

    name: str
    peak_flops: float
    memory_bytes: float


# NOTE: meta-llama/Meta-Llama-3-8B config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads,
# head dim 128, vocab 128,256; 8.03B parameters (model card).
LLAMA3_8B = ModelShape(name="Llama-3-8B", num_params=8.03e9, vocab_size=128256,
                       hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                       head_dim=128)
# NOTE: NVIDIA H100 SXM5 datasheet: 989.4 TFLOPS dense BF16 (1,979 with sparsity), 80 GB HBM3.
H100_SXM = GpuSpec(name="H100 SXM5", peak_flops=989.4e12, memory_bytes=80e9)

# Transfer paths into one GPU's memory, effective rates (docs/routing.md, "Transfer paths").
TIERS: dict[str, TransferEstimate] = {
    # 400 Gb/s RDMA NIC per GPU (50 GB/s line rate) at Mooncake's measured ~71% utilisation
    "rdma-400g": TransferEstimate(bytes_per_s=35e9, latency_s=0.5e-3),
    # 100 Gb/s Ethernet (12.5 GB/s line rate), TCP store server at 80%
    "tcp-100g": TransferEstimate(bytes_per_s=10e9, latency_s=1e-3),
    # 10 Gb/s Ethernet (1.25 GB/s line rate) at 80%: slower than recomputing Llama-3-8B
    "tcp-10g": TransferEstimate(bytes_per_s=1e9, latency_s=2e-3),
}


def prefill_estimate(model: ModelShape, gpu: GpuSpec, *, gemm_mfu: float = 0.6,
                     attn_mfu: float = 0.5, overhead_s: float = 5e-3) -> PrefillEstimate:
    """The prefill cost of ``model`` on ``gpu``: GEMM FLOPs per token and attention FLOPs
    per pair, each at its fraction of the GPU's peak.

    Raises:
        ValueError: a utilisation outside ``(0, 1]``.
    """
    for name, mfu in (("gemm_mfu", gemm_mfu), ("attn_mfu", attn_mfu)):
        if not 0 < mfu <= 1:
            raise ValueError(f"{name} must be in (0, 1], got {mfu}")
    return PrefillEstimate(token_s=model.gemm_flops_per_token / (gpu.peak_flops * gemm_mfu),
                           pair_s=model.attn_flops_per_pair / (gpu.peak_flops * attn_mfu),
                           overhead_s=overhead_s)
