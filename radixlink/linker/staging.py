"""The linker's name for the shared staging layout (``stores.frames``): kept for its importers."""

from radixlink.stores.frames import ALIGN, LEAD, Frames, frame_stride, frames_bytes, layout_frames

__all__ = ["ALIGN", "LEAD", "Frames", "frame_stride", "frames_bytes", "layout_frames"]
