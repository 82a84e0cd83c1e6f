"""A compact hybrid causal LM (full attention, sliding-window attention, Mamba-style layers).

Owns the layers and the forward pass over a ``PagedCache`` (paged.py), sized by a ``ModelSpec``
(spec.py). Must not allocate slots, touch the tree or decide what is cached: callers pass slots in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from radixlink.contract import ComponentType
from radixlink.engine.mamba import MambaMixer
from radixlink.engine.paged import ForwardInput, PagedCache, check_forward
from radixlink.engine.spec import ModelSpec

# ForwardInput, PagedCache and ModelSpec: re-exported for existing imports.
__all__ = ["ForwardInput", "HybridLM", "ModelSpec", "PagedCache"]


@dataclass(slots=True)
class _AttnPlan:
    read_slots: torch.Tensor
    mask: torch.Tensor | None  # True = may attend; None with is_causal or "see everything"
    is_causal: bool


def _attn_plan(pos: torch.Tensor, read_slots: torch.Tensor, window: int) -> _AttnPlan:
    """Masks for queries at ``pos`` over keys at the last ``len(read_slots)`` positions."""
    end = int(pos[-1]) + 1
    num_keys, n = read_slots.numel(), pos.numel()
    if num_keys == n and (window <= 0 or window >= n):
        return _AttnPlan(read_slots, None, True)  # NOTE: fused causal kernel, no mask tensor
    key_pos = torch.arange(end - num_keys, end, device=pos.device)
    mask = key_pos[None, :] <= pos[:, None]
    if window > 0:
        mask &= key_pos[None, :] > pos[:, None] - window
    return _AttnPlan(read_slots, None if n == 1 and bool(mask.all()) else mask, False)



class _Linear(nn.Linear):
    """A bias-free Linear left uninitialised: every weight is loaded (see weights.load_model)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def reset_parameters(self) -> None:  # NOTE: skips ~1 s of random init for SmolLM2
        pass


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, half-split convention (pairs i and i + head_dim/2)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """RoPE + GQA attention that writes K/V rows at slots and reads them back by slot."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = _Linear(hidden_size, num_heads * head_dim)
        self.k_proj = _Linear(hidden_size, num_kv_heads * head_dim)
        self.v_proj = _Linear(hidden_size, num_kv_heads * head_dim)
        self.o_proj = _Linear(num_heads * head_dim, hidden_size)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                k_pool: torch.Tensor, v_pool: torch.Tensor, out_slots: torch.Tensor,
                plan: _AttnPlan) -> torch.Tensor:
        n = x.shape[0]
        q = _rope(self.q_proj(x).view(n, self.num_heads, self.head_dim), *rope)
        k = _rope(self.k_proj(x).view(n, self.num_kv_heads, self.head_dim), *rope)
        # NOTE: index_copy_/index_select are ~5x faster than advanced indexing on CPU.
        k_pool.index_copy_(0, out_slots, k)
        v_pool.index_copy_(0, out_slots, self.v_proj(x).view(n, self.num_kv_heads, self.head_dim))
        keys = k_pool.index_select(0, plan.read_slots).transpose(0, 1).unsqueeze(0)
        values = v_pool.index_select(0, plan.read_slots).transpose(0, 1).unsqueeze(0)
        group = self.num_heads // self.num_kv_heads
        if n == 1:  # NOTE: decode: a group's query heads become rows, so K/V are not copied
            q = q.view(1, self.num_kv_heads, group, self.head_dim)
        else:  # NOTE: 4-D inputs without enable_gqa take the fused CPU kernel (3-4x faster)
            q = q.transpose(0, 1).unsqueeze(0)
            keys, values = (t.repeat_interleave(group, dim=1) for t in (keys, values))
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=plan.mask,
                                             is_causal=plan.is_causal)
        if n > 1:
            out = out.transpose(1, 2)
        return self.o_proj(out.reshape(n, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = _Linear(hidden_size, intermediate_size)
        self.up_proj = _Linear(hidden_size, intermediate_size)
        self.down_proj = _Linear(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, kind: ComponentType):
        super().__init__()
        self.kind = kind
        self.input_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mixer: nn.Module = Attention(
            spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim
        ) if kind != ComponentType.MAMBA else MambaMixer(
            hidden_size=spec.hidden_size, num_heads=spec.mamba_num_heads,
            head_dim=spec.mamba_head_dim, state_dim=spec.mamba_state_dim,
            conv_kernel=spec.mamba_conv_kernel, chunk_len=spec.mamba_chunk_len,
            eps=spec.rms_norm_eps)
        self.post_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = MLP(spec.hidden_size, spec.intermediate_size)


class HybridLM(nn.Module):
    """Causal LM over layers of ``spec.layer_types``; embeddings tied to the output head.

    Call ``model(inp, cache)`` -> logits ``[n, vocab]`` (``[1, vocab]`` with ``last_only``).
    Build it with ``weights.load_model`` / ``random_model``: parameters start uninitialised.
    """

    inv_freq: torch.Tensor

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size, _weight=torch.empty(
            spec.vocab_size, spec.hidden_size))
        self.layers = nn.ModuleList(Block(spec, kind) for kind in spec.layer_types)
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        half = torch.arange(0, spec.head_dim, 2, dtype=torch.int64).float()
        self.register_buffer("inv_freq", 1.0 / spec.rope_theta ** (half / spec.head_dim),
                             persistent=False)
        self._pool_index = [spec.layer_ids(kind).index(i) for i, kind in
                            enumerate(spec.layer_types)]

    @torch.inference_mode()
    def forward(self, inp: ForwardInput, cache: PagedCache) -> torch.Tensor:
        check_forward(self.spec, inp, cache, self.embed.weight.device)
        n, prefix_len = inp.token_ids.numel(), inp.prefix_len
        pos = torch.arange(prefix_len, prefix_len + n, device=self.embed.weight.device)
        freqs = pos[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)[:, None, :]
        rope = (emb.cos().to(self.spec.dtype), emb.sin().to(self.spec.dtype))
        full_plan = _attn_plan(pos, inp.seq_slots, 0) if cache.full_k else None
        swa_plan = _attn_plan(pos, inp.swa_seq_slots, self.spec.sliding_window) if (
            cache.swa_k and inp.swa_seq_slots is not None) else None
        h = self.embed(inp.token_ids.long())
        blocks = cast("list[Block]", list(self.layers))
        wait = inp.wait_layer
        for i, (block, j) in enumerate(zip(blocks, self._pool_index, strict=True)):
            if wait is not None:
                wait(i)  # NOTE: layer i's cached K/V may still be landing (layer-wise load)
            x = block.input_norm(h)
            if block.kind == ComponentType.FULL:
                x = block.mixer(x, rope, cache.full_k[j], cache.full_v[j], inp.out_slots,
                                full_plan)
            elif block.kind == ComponentType.SWA:
                x = block.mixer(x, rope, cache.swa_k[j], cache.swa_v[j], inp.swa_out_slots,
                                swa_plan)
            else:
                x = block.mixer(x, cache.conv_states[j], cache.ssm_states[j], inp.state_slot,
                                prefix_len > 0)
            h = h + x
            h = h + block.mlp(block.post_norm(h))
        if inp.last_only:
            h = h[-1:]
        return F.linear(self.norm(h), self.embed.weight)
