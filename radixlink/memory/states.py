"""Mamba-style recurrent-state slots: one row per slot in each state tensor, handed out singly.

Owns the one state-slot free list (``StateSlots``), the state tensors kept by it and byte-exact
state export and import (``pools.PagePool``'s byte I/O, a state as one page). Knows nothing of
the tree, of K/V pages (pools.py) or of stores.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from radixlink.memory.host import check_bytes, host_empty, sync, to_device
from radixlink.memory.layout import StateLayout

_UINT8 = torch.uint8


class StateSlots:
    """The one free list of state slots: ids ``1..num_states`` handed out one at a time, 0
    reserved (padding). ``MambaStatePool`` keeps its tensors' rows by it; index-only caches use
    it alone.

    Args:
        num_states: usable slots.
    """

    def __init__(self, num_states: int):
        if not isinstance(num_states, int) or isinstance(num_states, bool) or num_states <= 0:
            raise ValueError(f"num_states must be a positive int, got {num_states!r}")
        self.num_states = num_states
        self._free_slots = list(range(num_states, 0, -1))  # pop() hands out 1 first
        self._is_free = [False] + [True] * num_states

    def total_size(self) -> int:
        return self.num_states

    def available_size(self) -> int:
        return len(self._free_slots)

    def is_allocated(self, slot: int) -> bool:
        return isinstance(slot, int) and 1 <= slot <= self.num_states and not self._is_free[slot]

    def alloc(self) -> int | None:
        """A free slot (its contents are stale), or None when all are in use."""
        if not self._free_slots:
            return None
        slot = self._free_slots.pop()
        self._is_free[slot] = False
        return slot

    def free(self, slot: int) -> None:
        """Return ``slot``. Raises ValueError for a double free or a slot never handed out."""
        slot = self.allocated(slot, "free")
        self._is_free[slot] = True
        self._free_slots.append(slot)

    def allocated(self, slot: object, action: str) -> int:
        """``slot`` as an int; ValueError (naming ``action``) unless it is handed out."""
        try:
            value = operator.index(slot)  # type: ignore[arg-type]
        except TypeError:
            value = None
        if value is None or isinstance(slot, bool) or not 1 <= value <= self.num_states:
            raise ValueError(f"cannot {action} state slot {slot!r}: valid 1..{self.num_states}")
        if self._is_free[value]:
            raise ValueError(
                f"cannot {action} state slot {value}: it is not allocated (double free?)"
            )
        return value


class MambaStatePool(StateSlots):
    """Recurrent-state slots: per state tensor a storage ``[num_states + 1, *shape]``.

    Slot 0 is reserved (padding), slots 1..num_states are handed out one at a time. A state's
    bytes, as exported, are each tensor's row in ``layout.shapes`` order.

    Args:
        num_states: usable slots.
        layout: shapes and dtype of one slot.
        device: where the model reads the states.
    """

    def __init__(self, num_states: int, layout: StateLayout, device: str | torch.device = "cpu"):
        super().__init__(num_states)
        if not isinstance(layout, StateLayout):
            raise ValueError(f"layout must be a StateLayout, got {type(layout).__name__}")
        self.layout = layout
        dev = torch.device(device)
        self._storages = [
            torch.zeros((num_states + 1, *shape), dtype=layout.dtype, device=dev)
            for shape in layout.shapes
        ]
        self.device = self._storages[0].device

    # ---------------------------------------------------------------- PagePool: a state a page

    replicated = False
    token_bytes = 0  # a state is one per prefix, not per token
    land_layers = 0  # a state lands whole

    @property
    def num_pages(self) -> int:
        """Slot ids below this (0 is padding)."""
        return self.num_states + 1

    @property
    def page_bytes(self) -> int:
        return self.layout.state_bytes

    def page_ids(self, slots: torch.Tensor) -> Any:
        """The state slots themselves, one id per state (numpy for CPU slots)."""
        flat = slots.reshape(-1)
        return flat.numpy() if flat.device.type == "cpu" else flat

    def gather(self, pages: Any, out: torch.Tensor) -> None:
        """The states ``pages`` into the rows of host ``out``."""
        for row, slot in enumerate(pages):
            self.read_state(int(slot), out=out[row])

    def stage(self, buf: torch.Tensor) -> torch.Tensor:
        return buf  # NOTE: write_state moves each state to the device itself

    def scatter(self, pages: Any, buf: torch.Tensor, layer: int | None = None) -> None:
        """The rows of ``buf`` into the states ``pages`` (whole: ``layer`` is None)."""
        for row, slot in enumerate(pages):
            self.write_state(int(slot), buf[row])

    @property
    def num_tensors(self) -> int:
        return len(self._storages)

    def tensors(self, i: int) -> torch.Tensor:
        """Storage of state tensor ``i``: ``[num_states + 1, *layout.shapes[i]]``, row = slot."""
        if not isinstance(i, int) or not 0 <= i < len(self._storages):
            raise ValueError(f"state tensor index must be in 0..{self.num_tensors - 1}, got {i!r}")
        return self._storages[i]

    def copy(self, src: int, dst: int) -> None:
        """Copy state ``src`` into ``dst`` (copy-on-write); both must be allocated."""
        src, dst = self.allocated(src, "copy from"), self.allocated(dst, "copy to")
        for storage in self._storages:
            storage[dst].copy_(storage[src])

    def read_state(self, slot: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """The bytes of ``slot`` as a uint8 CPU tensor ``[state_bytes]`` (optionally ``out``)."""
        slot = self.allocated(slot, "read")
        shape = (self.layout.state_bytes,)
        if out is None:
            out = (
                host_empty(shape)
                if self.device.type == "cuda"
                else torch.empty(shape, dtype=_UINT8)
            )
        elif check_bytes("out", out, shape).device.type != "cpu":
            raise ValueError(f"out must be a CPU tensor, got {out.device}")
        offset = 0
        for storage, nbytes in zip(self._storages, self.layout.tensor_bytes, strict=True):
            row = storage[slot].reshape(-1).view(_UINT8)
            out[offset : offset + nbytes].copy_(row, non_blocking=True)
            offset += nbytes
        sync(self.device)  # the caller reads host memory next
        return out

    def write_state(self, slot: int, buf: torch.Tensor) -> None:
        """Write ``buf`` (uint8 ``[state_bytes]``, as from ``read_state``) into ``slot``."""
        slot = self.allocated(slot, "write")
        src = to_device(check_bytes("buf", buf, (self.layout.state_bytes,)), self.device)
        offset = 0
        for storage, nbytes in zip(self._storages, self.layout.tensor_bytes, strict=True):
            storage[slot].reshape(-1).view(_UINT8).copy_(src[offset : offset + nbytes])
            offset += nbytes
        sync(self.device)  # the state is in place when this returns
