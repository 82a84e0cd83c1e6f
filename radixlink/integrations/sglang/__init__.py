"""radixlink inside SGLang 0.5.23, selected at launch without patching SGLang.

- ``radixlink.integrations.sglang.linker.RadixlinkLinker``: the unified cache external linker
  (``--unified-cache-external-linker-backend dynamic``).
- ``radixlink.integrations.sglang.hicache.RadixlinkHiCacheStorage``: the HiCache L3 storage
  backend (``--hicache-storage-backend dynamic``).

This package module imports nothing: ``linker`` and ``hicache`` import SGLang, so only an
engine that selected them pays for (or needs) it. Flags and config keys: docs/integrations.md.
"""
