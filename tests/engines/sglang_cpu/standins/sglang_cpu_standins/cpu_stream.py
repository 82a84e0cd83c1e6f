"""Stand-in for ``torch.cpu.Stream.synchronize``, which SGLang's
``srt/mem_cache/l2_transfer.py`` calls on its transfer streams.

Why: HiCache's device<->host transfers run "on a stream" (``device_module.stream(...)``); on
CPU, ``torch.cpu.Stream`` is a placeholder whose copies run synchronously on the calling
thread, so by the time SGLang waits on the stream the work is done. torch 2.13's placeholder
has no working ``synchronize``; the stand-in returns at once. No data is touched.
"""

from __future__ import annotations

from types import ModuleType

MODULE = "sglang.srt.mem_cache.l2_transfer"


def _synchronize(self: object) -> None:
    del self


def patch(module: ModuleType) -> None:
    del module
    import torch

    torch.cpu.Stream.synchronize = _synchronize  # type: ignore[method-assign]
