"""Host staging for page I/O, one noun: ``StagingArena`` (reusable host buffers by size class,
pinned when the pools are on CUDA) and ``Frames``, the layout of one pool's encoded pages
inside such a buffer, used by the transfer engine and every adapter.

Owns buffers and byte offsets. Must not touch the tree, stores or pools: gathers and scatters
write into the views it hands out; the codec fills headers in place; ``pages.pageio`` reads
and writes them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from radixlink.stores.pageformat import HEADER_BYTES

_MIN_CLASS = 1 << 12  # the smallest staging buffer
ALIGN = 16  # payloads start 16-byte aligned: pools move rows as up to 16-byte elements
LEAD = -HEADER_BYTES % ALIGN  # bytes before a frame's header so its payload is aligned


def frame_stride(frame_bytes: int) -> int:
    """Bytes between consecutive frames of ``frame_bytes`` (lead + frame, rounded up)."""
    return -(-(LEAD + frame_bytes) // ALIGN) * ALIGN


@dataclass(frozen=True, slots=True, kw_only=True)
class Frames:
    """``count`` encoded pages of one pool in a staging buffer.

    ::

        buffer  ... | lead | header | payload (page_bytes) | tag? | pad | lead | header | ...
                    ^offset        ^offset + LEAD + HEADER_BYTES (16-byte aligned)
                    |<------------------------ stride ------------------------>|

    Attributes:
        buffer: the staging buffer (uint8, 1-D, 16-byte aligned).
        view: a byte memoryview of ``buffer`` (made once per buffer: 3 us each).
        offset: where frame 0's lead starts (a multiple of ``ALIGN``).
        count: pages.
        page_bytes: payload bytes of a page.
        frame_bytes: header + payload + tag of a page (the codec's ``frame_bytes``).
        stride: bytes between consecutive frames (``frame_stride(frame_bytes)``).
    """

    buffer: torch.Tensor
    view: memoryview
    offset: int
    count: int
    page_bytes: int
    frame_bytes: int
    stride: int

    @property
    def nbytes(self) -> int:
        return self.count * self.stride

    def payloads(self) -> torch.Tensor:
        """The payloads as uint8 ``[count, page_bytes]`` with spaced rows (no copy)."""
        start = self.offset + LEAD + HEADER_BYTES
        return self.buffer.as_strided((self.count, self.page_bytes), (self.stride, 1), start)

    def block(self) -> memoryview:
        """The frames as one writable view: frame ``i`` starts at ``i * stride`` of it."""
        start = self.offset + LEAD
        return self.view[start : self.offset + self.count * self.stride]

    def frames(self) -> list[memoryview]:
        """One writable byte view per page: its whole frame (header, payload, tag)."""
        stride, size = self.stride, self.frame_bytes
        first = self.offset + LEAD
        end = first + self.count * stride
        # NOTE: slices built and applied in C (a comprehension costs a Python frame per call)
        return list(map(self.view.__getitem__,
                        map(slice, range(first, end, stride), range(first + size, end + size,
                                                                    stride))))


def layout_frames(buffer: torch.Tensor, view: memoryview,
                  sizes: list[tuple[int, int, int]]) -> list[Frames]:
    """Lay out consecutive ``Frames`` blocks in ``buffer`` for ``(count, page_bytes,
    frame_bytes)`` triples, in order; ``buffer`` must hold ``frames_bytes(sizes)``."""
    out, offset = [], 0
    for count, page_bytes, frame_bytes in sizes:
        stride = frame_stride(frame_bytes)
        out.append(Frames(buffer=buffer, view=view, offset=offset, count=count,
                          page_bytes=page_bytes, frame_bytes=frame_bytes, stride=stride))
        offset += count * stride
    assert offset <= buffer.numel(), f"{offset} staging bytes needed, {buffer.numel()} held"
    return out


def frames_bytes(sizes: list[tuple[int, int, int]]) -> int:
    """Bytes ``layout_frames`` needs for ``sizes``."""
    total = 0
    for count, _, frame in sizes:
        total += count * frame_stride(frame)
    return total



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

    def reserve(self, nbytes: int, count: int) -> bool:
        """Fault ``count`` buffers of ``nbytes`` in now and cache them (as far as
        ``max_cached_bytes`` allows): the first jobs to ask for them then touch no new memory,
        whose page faults can cost more than the read itself (a fresh vLLM CPU worker: 0.7 s
        for 256 MiB, 11 us per 4 KiB page, measured).

        Best effort: False, with nothing held, when the memory could not be had (loads then
        allocate as they go)."""
        buffers = []
        try:
            for _ in range(count):
                buffers.append(self.acquire(nbytes))
                buffers[-1][0].zero_()
        except (MemoryError, RuntimeError):  # NOTE: torch's CPU allocator raises RuntimeError
            return False
        finally:
            for buffer in buffers:
                self.release(*buffer)
        return True

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
