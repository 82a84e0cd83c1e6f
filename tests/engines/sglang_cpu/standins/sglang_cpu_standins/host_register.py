"""Stand-in for ``_cuda_host_register`` in SGLang's ``srt/mem_cache/pool_host/common.py``.

Why: HiCache allocates its host pool with ``alloc_with_host_register``, which pins the buffer
through ``torch.cuda.cudart().cudaHostRegister`` whenever ``pin_memory`` is on, and that needs
CUDA. On CPU the host pool and the device pool are both plain memory: nothing to pin, so the
stand-in does nothing. No data is touched.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

MODULE = "sglang.srt.mem_cache.pool_host.common"


def _no_host_register(buffer: Any, registration_granularity_bytes: int | None = None) -> None:
    del buffer, registration_granularity_bytes


def patch(module: ModuleType) -> None:
    module._cuda_host_register = _no_host_register  # type: ignore[attr-defined]
