"""Host-side byte buffers: pinned staging, reusable staging buffers (``StagingArena``), uint8
checks, copies.

Owns how page/state bytes cross between host and device. Knows nothing of pool layouts, slots
or allocation (pools.py, states.py, allocator.py).
"""

from __future__ import annotations

import threading

import torch

_UINT8 = torch.uint8
_MIN_CLASS = 1 << 12  # the smallest staging buffer


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


class StagingArena:
    """Reusable host buffers by power-of-two size class; buffers come back with ``release``
    (from any thread). At most ``max_cached_bytes`` of released buffers are kept.

    Args:
        pinned: allocate page-locked memory (the pools are on CUDA).
        max_cached_bytes: released bytes kept for reuse; the rest is freed.
    """

    def __init__(self, *, pinned: bool = False, max_cached_bytes: int = 64 << 20):
        self.pinned = pinned
        self.max_cached_bytes = max_cached_bytes
        self._free: dict[int, list[tuple[torch.Tensor, memoryview]]] = {}
        self._cached = 0
        self._lock = threading.Lock()
        self._counts = {"staging_allocs": 0, "staging_reuses": 0}

    def acquire(self, nbytes: int) -> tuple[torch.Tensor, memoryview]:
        """A buffer of at least ``nbytes`` (contents stale) and its byte view."""
        size = max(_MIN_CLASS, 1 << max(0, nbytes - 1).bit_length())
        with self._lock:
            free = self._free.get(size)
            if free:
                self._cached -= size
                self._counts["staging_reuses"] += 1
                return free.pop()
            self._counts["staging_allocs"] += 1
        # NOTE: never an inference tensor, even when first asked for under an engine's
        # torch.inference_mode (vLLM's model runner): a reused buffer is written in place on
        # I/O threads, where an inference tensor refuses in-place updates.
        with torch.inference_mode(False):
            buffer = torch.empty(size, dtype=torch.uint8, pin_memory=self.pinned)
        return buffer, buffer.numpy().data

    def release(self, buffer: torch.Tensor, view: memoryview) -> None:
        """Give a buffer back (nobody may use it afterwards)."""
        size = buffer.numel()
        with self._lock:
            if self._cached + size <= self.max_cached_bytes:
                self._free.setdefault(size, []).append((buffer, view))
                self._cached += size

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {**self._counts, "staging_cached_bytes": self._cached}
