"""Host-side byte buffers: pinned staging, uint8 checks, host->device copies, stream sync (the
page layer's reusable staging is ``pages.staging``).

Owns how page/state bytes cross between host and device. Knows nothing of pool layouts, slots
or allocation (pools.py, states.py, allocator.py).
"""

from __future__ import annotations

import torch

_UINT8 = torch.uint8


def host_empty(shape: tuple[int, ...]) -> torch.Tensor:
    """A host uint8 buffer, pinned when CUDA is present (the staging tier)."""
    return torch.empty(shape, dtype=_UINT8, pin_memory=torch.cuda.is_available())


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def check_bytes(name: str, buf: object, shape: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(buf, torch.Tensor):
        raise ValueError(f"{name} must be a uint8 torch.Tensor, got {type(buf).__name__}")
    if buf.dtype != _UINT8:
        raise ValueError(f"{name} must be uint8, got {buf.dtype}; use .view(torch.uint8)")
    if tuple(buf.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(buf.shape)}, expected {shape}")
    return buf


def to_device(buf: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``buf`` on ``device``; host data bound for CUDA goes through pinned staging."""
    if buf.device == device:
        return buf
    if device.type == "cuda" and buf.device.type == "cpu" and not buf.is_pinned():
        staged = host_empty(tuple(buf.shape))
        staged.copy_(buf)
        buf = staged
    # NOTE: the caching host allocator keeps `staged` alive until this copy has run.
    return buf.to(device, non_blocking=True)

