"""The paged-cache view the model reads and writes by slot (``PagedCache``), one step's input
(``ForwardInput``) and their validation at the forward's boundary.

Must not allocate slots, touch the tree or run layers (model.py): callers pass slots in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from radixlink.contract import ComponentType
from radixlink.engine.spec import ModelSpec


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


def check_forward(spec: ModelSpec, inp: ForwardInput, cache: PagedCache,
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
