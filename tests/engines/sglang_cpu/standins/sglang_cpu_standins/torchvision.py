"""Stand-in for ``torchvision`` and its submodules: modules with no content, served under
those names by ``sitecustomize`` to every SGLang process of the real-engine suite.

Why: SGLang 0.5.23 imports torchvision at module level in multimodal configs and processors
that the engine imports for every model (``srt/configs/deepseek_ocr.py``,
``srt/multimodal/internvl_utils.py``: ``torchvision.transforms``, ``InterpolationMode``), and
PyPI's torchvision build does not load beside the local ``torch==2.13.0+cpu`` wheel. Text
models never use it. Any name looked up on these modules is a placeholder: attribute access
gives another placeholder (``InterpolationMode.BICUBIC`` at import time), a call is recorded
(``$RADIXLINK_STANDIN_CALLS``) and raises. transformers decides whether torchvision exists by
``find_spec``; it is asked before this module becomes findable (``sitecustomize``), so it keeps
its no-torchvision paths. Test-side only; never in the library.
"""

from __future__ import annotations

from typing import Any, NoReturn

from sglang_cpu_standins import record


class Placeholder:
    """A torchvision name no text model uses."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Placeholder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        record(self._name)
        raise NotImplementedError(f"{self._name} is a test stand-in (torchvision); it was called")

    def __repr__(self) -> str:
        return f"<stand-in {self._name}>"


def __getattr__(attr: str) -> Placeholder:
    if attr.startswith("__"):
        raise AttributeError(attr)
    return Placeholder(f"{__name__}.{attr}")
