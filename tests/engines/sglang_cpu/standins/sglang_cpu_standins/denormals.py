"""Process setup, not a stand-in: ``torch.set_flush_denormal(True)`` in every SGLang process.

Why: SGLang's ``torch_native`` attention backend (``srt/layers/attention/
torch_native_backend.py``, its extend path) reads rows of uninitialised memory when it gathers
a request's K/V; when those bytes decode to denormal fp32 values, fp32 arithmetic on x86 runs
about 30x slower (measured: a HiCache store hit took 29 s against 2.0 s for the cold run, and
0.79 s with denormals flushed). The masked rows never reach an output, so flushing them to
zero changes no token (the suite compares every output with HF transformers). Set when torch
is first imported, on the importing thread, before torch starts its worker threads (which
inherit the floating-point control state).
"""

from __future__ import annotations

from types import ModuleType

MODULE = "torch"


def patch(module: ModuleType) -> None:
    module.set_flush_denormal(True)
