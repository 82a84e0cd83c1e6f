"""The model's spec: sizes, layer kinds and the shapes the pools must have, and its cache identity.

Owns ``ModelSpec`` only. Must not touch tensors, pools or the forward pass (paged.py, model.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import torch

from radixlink.contract import ComponentType


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """Everything an engine needs to size pools for a model, and its cache identity.

    ``layer_types[i]`` is the kind of layer ``i``. Pools are indexed per kind: the j-th FULL
    layer reads ``PagedCache.full_k[j]``, the j-th SWA layer ``swa_k[j]``, the j-th MAMBA layer
    ``conv_states[j]`` / ``ssm_states[j]`` (see ``layer_ids``).
    """

    name: str
    weights: str  # where the weights come from (file + quantisation, or the seed)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layer_types: tuple[ComponentType, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int = 0  # SWA window in tokens: a query sees itself and W-1 earlier tokens
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    mamba_num_heads: int = 0
    mamba_head_dim: int = 0
    mamba_state_dim: int = 0
    mamba_conv_kernel: int = 4
    mamba_chunk_len: int = 64
    dtype: torch.dtype = torch.float32

    def layer_ids(self, kind: ComponentType) -> list[int]:
        """Model layer indices of one kind, in pool order."""
        return [i for i, t in enumerate(self.layer_types) if t == kind]

    @property
    def mamba_conv_dim(self) -> int:
        return self.mamba_num_heads * self.mamba_head_dim + 2 * self.mamba_state_dim

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        """Per-slot conv state of one MAMBA layer."""
        return (self.mamba_conv_dim, self.mamba_conv_kernel - 1)

    @property
    def ssm_state_shape(self) -> tuple[int, int, int]:
        """Per-slot SSM state of one MAMBA layer."""
        return (self.mamba_num_heads, self.mamba_head_dim, self.mamba_state_dim)

    @property
    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Shapes of one state slot for a state pool: (conv, ssm), each stacked over layers."""
        num = len(self.layer_ids(ComponentType.MAMBA))
        return (num, *self.conv_state_shape), (num, *self.ssm_state_shape)

    def fingerprint(self) -> str:
        """Deterministic id of model + config + weights, for cache namespaces."""
        fields = {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]
        text = json.dumps(fields, default=str, sort_keys=True)
        return f"{self.name}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
