"""Test-side stand-ins for the GPU-only pieces a real SGLang 0.5.23 engine reaches on CPU, and
the call record the suite checks. Loaded into every SGLang process of the real-engine suite
(and ``make demo-sglang`` / ``radixlink bench sglang``) by ``sitecustomize`` on ``PYTHONPATH``;
the library never imports any of it.

One module per stand-in, each naming the SGLang file it stands in for and why:
``torchvision`` and ``sgl_kernel`` (packages beside this one), ``host_register``,
``transfer_kv``, ``cpu_stream`` (HiCache's host pool), ``denormals`` (process setup). None
replaces model math.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NoReturn

CALLS_ENV = "RADIXLINK_STANDIN_CALLS"


def record(name: str) -> None:
    """Append ``name`` (and this pid) to the file ``$RADIXLINK_STANDIN_CALLS`` names."""
    path = os.environ.get(CALLS_ENV)
    if path:
        with open(path, "a") as out:
            out.write(f"{os.getpid()} {name}\n")


def raising(name: str) -> Callable[..., NoReturn]:
    """A function that records its call and raises: a GPU kernel no CPU path should reach."""

    def stub(*args: Any, **kwargs: Any) -> NoReturn:
        record(name)
        raise NotImplementedError(f"{name} is a test stand-in (no CPU kernel); it was called")

    stub.__name__ = name.rsplit(".", 1)[-1]
    stub.__qualname__ = stub.__name__
    return stub
