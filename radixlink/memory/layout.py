"""Layout descriptors of the device pools (K/V pages, recurrent state) and their fingerprints.

Owns sizes and the stable fingerprint string stores put in page headers. Holds no tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from radixlink.contract import PoolName

# Bump when the meaning of a fingerprint field changes: old pages then read as misses.
KV_LAYOUT_VERSION = 1
STATE_LAYOUT_VERSION = 1


def _check_positive(owner: str, name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}")


def _check_dtype(owner: str, dtype: object) -> None:
    # NOTE: bool and complex hold no KV or state any engine writes; integer types stay
    # allowed (engines keep fp8 KV as uint8).
    if (not isinstance(dtype, torch.dtype) or dtype == torch.bool or dtype.is_complex):
        raise ValueError(
            f"{owner}.dtype must be a torch.dtype (numeric: not bool or complex) such as "
            f"torch.float16, got {dtype!r}"
        )


def dtype_name(dtype: torch.dtype) -> str:
    """The process-independent name of ``dtype`` ("float16", "bfloat16", ...)."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True, slots=True, kw_only=True)
class KVLayout:
    """Shape of one K/V pool (full attention or SWA): what one page holds.

    Attributes:
        num_layers: attention layers stored in this pool.
        num_kv_heads: K/V heads per layer on this rank.
        head_dim: elements per head.
        dtype: element type of K and V.
        page_size: tokens per page.
        replicated: the pool is identical on every tensor-parallel rank (written by one rank).
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    page_size: int
    replicated: bool = False

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "page_size"):
            _check_positive("KVLayout", name, getattr(self, name))
        _check_dtype("KVLayout", self.dtype)
        if not isinstance(self.replicated, bool):
            raise ValueError(f"KVLayout.replicated must be a bool, got {self.replicated!r}")

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def token_bytes(self) -> int:
        """Bytes of one token: K and V, all layers, all heads."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.itemsize

    @property
    def page_bytes(self) -> int:
        """Bytes of one page: ``page_size`` tokens."""
        return self.token_bytes * self.page_size

    def fingerprint(self, pool: PoolName = PoolName.KV) -> str:
        """A string naming this layout, equal across processes and restarts.

        Args:
            pool: which pool the layout describes (KV or SWA); part of the fingerprint so a
                full-attention page is never read as an SWA page of the same shape.

        Returns:
            e.g. ``"kv1:kv:L4:H2:D64:float16:P16:R0"``.
        """
        pool_name = PoolName(pool).value
        return (
            f"kv{KV_LAYOUT_VERSION}:{pool_name}:L{self.num_layers}:H{self.num_kv_heads}"
            f":D{self.head_dim}:{dtype_name(self.dtype)}:P{self.page_size}"
            f":R{int(self.replicated)}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StateLayout:
    """Shape of one recurrent-state slot (Mamba-style layers).

    Attributes:
        shapes: the shape of each state tensor of one slot, e.g.
            ``((num_layers, conv_dim, conv_kernel), (num_layers, heads, head_dim, d_state))``.
            Lists are accepted and stored as tuples.
        dtype: element type of every state tensor.
    """

    shapes: tuple[tuple[int, ...], ...]
    dtype: torch.dtype

    def __post_init__(self) -> None:
        if not isinstance(self.shapes, (tuple, list)) or not self.shapes:
            raise ValueError(
                f"StateLayout.shapes must be a non-empty sequence of shapes, got {self.shapes!r}"
            )
        shapes = []
        for i, shape in enumerate(self.shapes):
            if not isinstance(shape, (tuple, list, torch.Size)) or not shape:
                raise ValueError(
                    f"StateLayout.shapes[{i}] must be a non-empty tuple of ints, got {shape!r}"
                )
            for dim in shape:
                _check_positive("StateLayout", f"shapes[{i}] dim", dim)
            shapes.append(tuple(shape))
        # NOTE: frozen dataclass; normalising lists to tuples keeps it hashable.
        object.__setattr__(self, "shapes", tuple(shapes))
        _check_dtype("StateLayout", self.dtype)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def tensor_bytes(self) -> tuple[int, ...]:
        """Bytes of each state tensor of one slot, in ``shapes`` order."""
        return tuple(math.prod(shape) * self.itemsize for shape in self.shapes)

    @property
    def state_bytes(self) -> int:
        """Bytes of one whole state slot (all tensors)."""
        return sum(self.tensor_bytes)

    def fingerprint(self, pool: PoolName = PoolName.MAMBA) -> str:
        """A string naming this layout, equal across processes and restarts.

        Returns:
            e.g. ``"state1:mamba:float32:S2x4x8,2x16x32"``.
        """
        dims = ",".join("x".join(str(d) for d in shape) for shape in self.shapes)
        return (
            f"state{STATE_LAYOUT_VERSION}:{PoolName(pool).value}:{dtype_name(self.dtype)}:S{dims}"
        )
