"""Loads the SGLang-on-CPU stand-ins into every Python process started with this directory
on ``PYTHONPATH`` (the real-engine suite's engines, ``make demo-sglang``, ``radixlink bench
sglang``). SGLang spawns its scheduler and detokenizer as fresh interpreters, so a
``sitecustomize`` is the one place that reaches them all. Test- and demo-side only: the library
never imports any of it.

- ``sgl_kernel`` is a package in this directory (found by the normal import system).
- ``torchvision`` (and every ``torchvision.*``) is served from
  ``sglang_cpu_standins/torchvision.py`` by the finder below,
  which is blind while transformers asks whether torchvision exists (transformers caches the
  answer; with a torchvision present it imports ``torchvision.io`` and more).
- The patches of ``sglang_cpu_standins`` run right after the module each one names is imported
  (a post-import hook), so a process that never imports that module is left alone.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

_PATCHES = {
    "torch": ("denormals",),
    "transformers.utils.import_utils": (),  # NOTE: see _StandIns.exec_module
    "sglang.srt.mem_cache.pool_host.common": ("host_register",),
    "sglang.srt.mem_cache.pool_host.mha": ("transfer_kv",),
    "sglang.srt.mem_cache.l2_transfer": ("cpu_stream",),
}
_TORCHVISION = Path(__file__).parent / "sglang_cpu_standins" / "torchvision.py"


class _StandIns(importlib.abc.MetaPathFinder):
    """Serves ``torchvision`` and wraps the loader of each module in ``_PATCHES``."""

    def __init__(self) -> None:
        self.blind = False

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001, ANN201
        if self.blind:
            return None
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.util.spec_from_file_location(
                fullname, _TORCHVISION, submodule_search_locations=[])
        if fullname not in _PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Patching(spec.loader, fullname, self)
                return spec
        return None


class _Patching(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, name: str, finder: _StandIns) -> None:
        self._inner = inner
        self._name = name
        self._finder = finder

    def create_module(self, spec):  # noqa: ANN001, ANN201
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:  # noqa: ANN001
        self._inner.exec_module(module)
        if self._name == "transformers.utils.import_utils":
            self._finder.blind = True
            try:
                module.is_torchvision_available()  # cached False: no torchvision here
            finally:
                self._finder.blind = False
        for name in _PATCHES[self._name]:
            importlib.import_module(f"sglang_cpu_standins.{name}").patch(module)

    def __getattr__(self, name: str):  # noqa: ANN204 - e.g. get_resource_reader, is_package
        return getattr(self._inner, name)


sys.meta_path.insert(0, _StandIns())
