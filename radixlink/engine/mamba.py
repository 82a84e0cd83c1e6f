"""A Mamba-2-style recurrent mixer: short causal conv + scalar-decay-per-head SSM over state slots.

Owns the mixer math (chunked SSD prefill, one-step decode) and its state-slot reads/writes.
Must not touch K/V pools, the tree or the cache: the caller hands it the state storage and a slot.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _segsum(x: torch.Tensor) -> torch.Tensor:
    """Segment sums over the last dim: ``out[..., i, j] = sum(x[..., j+1 : i+1])`` for j <= i.

    Entries above the diagonal are -inf so that ``exp(out)`` is a causal decay matrix. Summing
    only the relevant terms (not differencing a long cumsum) keeps the decays exact in float32.
    """
    t = x.shape[-1]
    rep = x.unsqueeze(-1).expand(*x.shape, t)  # rep[..., k, j] = x[k]
    strict = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=-1)
    sums = torch.cumsum(rep.masked_fill(~strict, 0.0), dim=-2)  # sum over j < k <= i
    causal = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device))
    return sums.masked_fill(~causal, float("-inf"))


def ssd_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    log_decay: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    h0: torch.Tensor,
    chunk_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs ``h_t = exp(a_t) h_{t-1} + dt_t x_t b_t^T``, ``y_t = h_t c_t`` over n tokens at once.

    Chunked (SSD) form: quadratic inside chunks of ``chunk_len`` tokens, a segment-sum recurrence
    across chunks; no per-token loop.

    Args:
        x: [n, heads, head_dim] inputs.
        dt: [n, heads] step sizes.
        log_decay: [n, heads] ``a_t = dt_t * A`` (<= 0).
        b: [n, state_dim] input projections (one group shared by all heads).
        c: [n, state_dim] output projections.
        h0: [heads, head_dim, state_dim] state before the first token.
        chunk_len: tokens per chunk.

    Returns:
        (y [n, heads, head_dim], h_n [heads, head_dim, state_dim]).
    """
    n, heads, head_dim = x.shape
    pad = (-n) % chunk_len
    if pad:  # zero steps (a=0, dt=0) leave the state untouched
        x, dt, log_decay, b, c = (F.pad(t, (0, 0) * (t.dim() - 1) + (0, pad)) for t in
                                  (x, dt, log_decay, b, c))
    num_chunks = (n + pad) // chunk_len
    xdt = (x * dt.unsqueeze(-1)).view(num_chunks, chunk_len, heads, head_dim)
    a = log_decay.view(num_chunks, chunk_len, heads).transpose(1, 2)  # [c, h, q]
    bq = b.view(num_chunks, chunk_len, -1)
    cq = c.view(num_chunks, chunk_len, -1)

    decay = torch.exp(_segsum(a))  # [c, h, q(i), q(j)]: decay from token j to token i
    scores = torch.einsum("cin,cjn->cij", cq, bq)
    y = torch.einsum("chij,cij,cjhp->cihp", decay, scores, xdt)

    # State each chunk adds by its end, then the recurrence across chunks (h0 enters as chunk -1).
    chunk_states = torch.einsum("chj,cjhp,cjn->chpn", decay[:, :, -1, :], xdt, bq)
    states = torch.cat([h0.unsqueeze(0), chunk_states], dim=0)  # [c+1, h, p, n]
    chunk_log = F.pad(a.sum(-1), (0, 0, 1, 0))  # [c+1, h]; entry 0 is h0's (no decay)
    across = torch.exp(_segsum(chunk_log.transpose(0, 1)))  # [h, c+1, c+1]
    entering = torch.einsum("hck,khpn->chpn", across, states)  # state entering chunk c
    from_start = torch.exp(torch.cumsum(a, dim=-1))  # [c, h, q]: decay from chunk start
    y = y + torch.einsum("chpn,cin,chi->cihp", entering[:-1], cq, from_start)
    return y.reshape(num_chunks * chunk_len, heads, head_dim)[:n], entering[-1]


class GatedRMSNorm(nn.Module):
    """RMSNorm of ``y * silu(z)``, as in Mamba-2's output norm."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        y = y * F.silu(z)
        return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class MambaMixer(nn.Module):
    """Mamba-2-style mixer whose (conv_state, ssm_state) live in caller-owned slot storage.

    State shapes per slot: conv ``[conv_dim, kernel - 1]`` (the last inputs to the conv),
    ssm ``[num_heads, head_dim, state_dim]``.
    """

    def __init__(self, *, hidden_size: int, num_heads: int, head_dim: int, state_dim: int,
                 conv_kernel: int, chunk_len: int, eps: float):
        super().__init__()
        self.num_heads, self.head_dim, self.state_dim = num_heads, head_dim, state_dim
        self.inner_dim = num_heads * head_dim
        self.conv_dim = self.inner_dim + 2 * state_dim
        self.conv_kernel, self.chunk_len = conv_kernel, chunk_len
        self.in_proj = nn.Linear(hidden_size, self.inner_dim + self.conv_dim + num_heads,
                                 bias=False)
        self.conv_weight = nn.Parameter(torch.zeros(self.conv_dim, 1, conv_kernel))
        self.conv_bias = nn.Parameter(torch.zeros(self.conv_dim))
        self.dt_bias = nn.Parameter(torch.zeros(num_heads))
        self.a_log = nn.Parameter(torch.zeros(num_heads))
        self.d_skip = nn.Parameter(torch.ones(num_heads))
        self.norm = GatedRMSNorm(self.inner_dim, eps)
        self.out_proj = nn.Linear(self.inner_dim, hidden_size, bias=False)

    def forward(self, hidden: torch.Tensor, conv_states: torch.Tensor, ssm_states: torch.Tensor,
                slot: int, has_prefix: bool) -> torch.Tensor:
        """Mixes ``hidden`` [n, hidden_size], continuing from and updating state ``slot``.

        Reads ``conv_states[slot]`` / ``ssm_states[slot]`` when ``has_prefix`` (zeros otherwise,
        so a fresh slot may hold anything) and overwrites them with the state after the last
        new token.
        """
        n = hidden.shape[0]
        z, xbc, dt = torch.split(self.in_proj(hidden), [self.inner_dim, self.conv_dim,
                                                        self.num_heads], dim=-1)
        if has_prefix:
            conv_prev, h0 = conv_states[slot].transpose(0, 1), ssm_states[slot]
        else:
            conv_prev = xbc.new_zeros(self.conv_kernel - 1, self.conv_dim)
            h0 = xbc.new_zeros(self.num_heads, self.head_dim, self.state_dim)
        window = torch.cat([conv_prev, xbc], dim=0)  # [kernel - 1 + n, conv_dim]
        conv_states[slot] = window[n:].transpose(0, 1)
        conv = F.conv1d(window.transpose(0, 1).unsqueeze(0), self.conv_weight, self.conv_bias,
                        groups=self.conv_dim)
        xs, b, c = torch.split(F.silu(conv[0].transpose(0, 1)),
                               [self.inner_dim, self.state_dim, self.state_dim], dim=-1)
        xs = xs.reshape(n, self.num_heads, self.head_dim)
        dt = F.softplus(dt + self.dt_bias)
        log_decay = dt * -torch.exp(self.a_log)
        if n == 1:  # decode: one recurrence step
            h = torch.exp(log_decay[0])[:, None, None] * h0 + torch.einsum(
                "hp,n->hpn", xs[0] * dt[0, :, None], b[0])
            y = torch.einsum("hpn,n->hp", h, c[0]).unsqueeze(0)
        else:
            y, h = ssd_scan(xs, dt, log_decay, b, c, h0, self.chunk_len)
        ssm_states[slot] = h
        y = y + xs * self.d_skip[:, None]
        return self.out_proj(self.norm(y.reshape(n, self.inner_dim), z))
