"""A compact hybrid causal LM (full attention, sliding-window attention, Mamba-style layers).

Owns the model spec, the paged-cache view it reads/writes by slot index, and the forward pass.
Must not allocate slots, touch the tree or decide what is cached: callers pass slots in.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from radixlink.contract import ComponentType
from radixlink.engine.mamba import MambaMixer


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


class KVSource(Protocol):
    """What a K/V pool offers the model (the memory package's ``KVPool``)."""

    def k(self, layer: int) -> torch.Tensor: ...
    def v(self, layer: int) -> torch.Tensor: ...


class StateSource(Protocol):
    """What a state pool offers the model (the memory package's ``MambaStatePool``)."""

    def tensors(self, i: int) -> torch.Tensor: ...


@dataclass(slots=True, kw_only=True)
class PagedCache:
    """Pool tensors the model reads and writes, per layer kind, in ``ModelSpec.layer_ids`` order.

    K/V tensors are ``[num_slots, num_kv_heads, head_dim]`` (SWA ones indexed by SWA slots);
    state tensors are ``[num_states + 1, *shape]``. The model writes rows in place.
    """

    full_k: list[torch.Tensor] = field(default_factory=list)
    full_v: list[torch.Tensor] = field(default_factory=list)
    swa_k: list[torch.Tensor] = field(default_factory=list)
    swa_v: list[torch.Tensor] = field(default_factory=list)
    conv_states: list[torch.Tensor] = field(default_factory=list)
    ssm_states: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def allocate(cls, spec: ModelSpec, *, num_slots: int, num_swa_slots: int = 0,
                 num_states: int = 0, device: str | torch.device = "cpu") -> PagedCache:
        """Zeroed plain tensors (tests, simple callers)."""
        def zeros(rows: int, shape: tuple[int, ...], kind: ComponentType) -> list[torch.Tensor]:
            return [torch.zeros(rows, *shape, dtype=spec.dtype, device=device)
                    for _ in spec.layer_ids(kind)]

        kv, (f, w, m) = (spec.num_kv_heads, spec.head_dim), tuple(ComponentType)
        return cls(full_k=zeros(num_slots, kv, f), full_v=zeros(num_slots, kv, f),
                   swa_k=zeros(num_swa_slots, kv, w), swa_v=zeros(num_swa_slots, kv, w),
                   conv_states=zeros(num_states + 1, spec.conv_state_shape, m),
                   ssm_states=zeros(num_states + 1, spec.ssm_state_shape, m))

    @classmethod
    def from_pools(cls, spec: ModelSpec, *, kv: KVSource | None = None,
                   swa: KVSource | None = None, states: StateSource | None = None) -> PagedCache:
        """Views of pool storage: ``kv.k(j)`` for FULL layer j, ``swa.k(j)`` for SWA layer j,
        ``states.tensors(0)[:, m]`` / ``tensors(1)[:, m]`` = conv / ssm state of MAMBA layer m
        (a state pool laid out as ``spec.state_shapes``)."""
        nf, ns, nm = (len(spec.layer_ids(k)) for k in ComponentType)
        return cls(full_k=[kv.k(j) for j in range(nf)] if kv else [],
                   full_v=[kv.v(j) for j in range(nf)] if kv else [],
                   swa_k=[swa.k(j) for j in range(ns)] if swa else [],
                   swa_v=[swa.v(j) for j in range(ns)] if swa else [],
                   conv_states=[states.tensors(0)[:, m] for m in range(nm)] if states else [],
                   ssm_states=[states.tensors(1)[:, m] for m in range(nm)] if states else [])


@dataclass(slots=True, kw_only=True)
class ForwardInput:
    """One sequence's step: the uncached suffix and where its K/V and state live.

    ```
    position   0 ............ prefix_len ............ prefix_len + n
    seq_slots  |---- cached ----|------ out_slots ------|
    swa_seq    .........|-- >= W-1 cached --|-- swa_out_slots --|   (a suffix of the sequence)
    ```

    Attributes:
        token_ids: [n] new tokens (n >= 1).
        prefix_len: tokens already cached (their K/V in the pools, state in ``state_slot``).
        out_slots: [n] int64 full-pool slots the new tokens' K/V are written to.
        seq_slots: [prefix_len + n] int64 full-pool slots of the whole sequence, read for
            attention; its last n must equal ``out_slots``.
        swa_out_slots: [n] int64 SWA-pool slots for the new tokens (models with SWA layers).
        swa_seq_slots: int64 SWA slots of the last L tokens of the sequence, with
            ``n + min(prefix_len, W - 1) <= L <= prefix_len + n``; its last n equal
            ``swa_out_slots``. Older SWA rows are never read.
        state_slot: state slot to continue from and overwrite (models with MAMBA layers).
        last_only: return logits for the last token only.
        wait_layer: called with the model layer index before that layer reads the pools
            (layer-wise loading: it returns once the layer's cached K/V has landed, and
            raises to abandon the pass); None reads at once.
    """

    token_ids: torch.Tensor
    prefix_len: int
    out_slots: torch.Tensor
    seq_slots: torch.Tensor
    swa_out_slots: torch.Tensor | None = None
    swa_seq_slots: torch.Tensor | None = None
    state_slot: int | None = None
    last_only: bool = False
    wait_layer: Callable[[int], None] | None = None


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


def _check_slots(name: str, slots: torch.Tensor | None, device: torch.device, num_rows: int,
                 length: int | None = None, tail: torch.Tensor | None = None) -> torch.Tensor:
    if not isinstance(slots, torch.Tensor) or slots.dtype != torch.int64 or slots.dim() != 1:
        got = f"{slots.dtype}, {slots.dim()}-D" if isinstance(slots, torch.Tensor) else slots
        raise ValueError(f"{name} must be a 1-D int64 tensor, got {got}")
    if length is not None and slots.numel() != length:
        raise ValueError(f"{name} has {slots.numel()} slots, expected {length}")
    if slots.device != device:
        raise ValueError(f"{name} is on {slots.device}, the pools are on {device}")
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= num_rows):
        raise ValueError(f"{name} must lie in [0, {num_rows}), got "
                         f"[{int(slots.min())}, {int(slots.max())}]")
    if tail is not None and not torch.equal(slots[slots.numel() - tail.numel():], tail):
        raise ValueError(f"the last {tail.numel()} entries of {name} must equal the out slots")
    return slots


def _check_cache(spec: ModelSpec, cache: PagedCache, device: torch.device) -> None:
    kv, (f, w, m) = (spec.num_kv_heads, spec.head_dim), tuple(ComponentType)
    expected = {"full_k": (f, kv), "full_v": (f, kv), "swa_k": (w, kv), "swa_v": (w, kv),
                "conv_states": (m, spec.conv_state_shape), "ssm_states": (m, spec.ssm_state_shape)}
    for name, (kind, shape) in expected.items():
        tensors, want = getattr(cache, name), len(spec.layer_ids(kind))
        if len(tensors) != want:
            raise ValueError(f"cache.{name} has {len(tensors)} tensors, the model has {want} "
                             f"{kind.value} layers")
        for t in tensors:
            if tuple(t.shape[1:]) != shape or t.dtype != spec.dtype or t.device != device:
                raise ValueError(f"cache.{name} tensor is {tuple(t.shape)} {t.dtype} on "
                                 f"{t.device}; expected [rows, {shape}] {spec.dtype} on {device}")


def _check_forward(spec: ModelSpec, inp: ForwardInput, cache: PagedCache,
                   device: torch.device) -> None:
    """Validates one step at the boundary so the layers can assume well-formed input."""
    _check_cache(spec, cache, device)
    tokens, prefix_len = inp.token_ids, inp.prefix_len
    if (not isinstance(tokens, torch.Tensor) or tokens.dim() != 1 or tokens.numel() == 0
            or tokens.dtype not in (torch.int32, torch.int64) or tokens.device != device):
        raise ValueError("token_ids must be a non-empty 1-D int32/int64 tensor on the model's "
                         f"device {device}")
    if int(tokens.min()) < 0 or int(tokens.max()) >= spec.vocab_size:
        raise ValueError(f"token ids must lie in [0, {spec.vocab_size})")
    if not isinstance(prefix_len, int) or prefix_len < 0:
        raise ValueError(f"prefix_len must be an int >= 0, got {prefix_len!r}")
    n = tokens.numel()
    if cache.full_k:
        rows = cache.full_k[0].shape[0]
        out = _check_slots("out_slots", inp.out_slots, device, rows, n)
        _check_slots("seq_slots", inp.seq_slots, device, rows, prefix_len + n, tail=out)
    if cache.swa_k:
        rows, need = cache.swa_k[0].shape[0], n + min(prefix_len, spec.sliding_window - 1)
        out = _check_slots("swa_out_slots", inp.swa_out_slots, device, rows, n)
        seq = _check_slots("swa_seq_slots", inp.swa_seq_slots, device, rows, tail=out)
        if not need <= seq.numel() <= prefix_len + n:
            raise ValueError(f"swa_seq_slots has {seq.numel()} slots; with prefix_len="
                             f"{prefix_len}, n={n}, window={spec.sliding_window} it needs "
                             f"between {need} and {prefix_len + n} (the sequence's last ones)")
    if cache.conv_states:
        rows, slot = cache.conv_states[0].shape[0], inp.state_slot
        if not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < rows:
            raise ValueError(f"state_slot must be an int in [0, {rows}), got {slot!r}")


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
        _check_forward(self.spec, inp, cache, self.embed.weight.device)
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
