"""The page layer: what every adapter (the tree's linker, SGLang's linker and HiCache backend,
vLLM's connector) moves pages through, between the adapters and ``stores``.

- ``keys``: ``PageKeys``, the one key scheme;
- ``restore``: the restore rule (presence + hit policy -> restorable lengths), the one
  presence split, the trailing-window rule;
- ``staging``: host staging, ``StagingArena`` and the ``Frames`` layout;
- ``pageio``: codecs per pool, batched get -> verify, encode -> put, the presence query and
  the one corrupt-page policy;
- ``engine``: ``TransferEngine``, the one transfer engine (threads, jobs, close budget,
  stats).

This package module imports nothing (re-exports would import torch for a key).
"""
