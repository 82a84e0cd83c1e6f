"""Shared kit of the reliability tests: a small KV layout, a deterministic "model" whose K/V
depend on the whole token prefix and the namespace (tests/oracle.py), one-request flows through
cache + linker, and the checks every fault case ends with (invariants, exact accounting, no
unverified page in the tree).

Owns nothing of the library; used by tests/faults, tests/property and tests/integration.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import oracle
import serving
import torch

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import PoolName
from radixlink.hashing import Namespace
from radixlink.memory.layout import KVLayout
from radixlink.stores.codec import PageCodec

PS = 4
LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype=torch.float32, page_size=PS)
TOKENS = list(range(100, 140))  # 40 tokens = 10 pages
TESTS_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = TESTS_DIR.parent


MODEL_NS = Namespace(model="kit-model")
"""A model namespace for caches linked to shared stores (a linker refuses them without one)."""


def make_cache(num_tokens: int = 256, namespace: Namespace | None = None) -> UnifiedCache:
    return UnifiedCache(CacheConfig(page_size=PS, num_tokens=num_tokens, kv_layout=LAYOUT,
                                    namespace=namespace, enable_external_cache_linker=True))


def kv_codec() -> PageCodec:
    """The codec a linker uses for LAYOUT's full-attention pool."""
    return PageCodec(LAYOUT.fingerprint(PoolName.KV), LAYOUT.page_bytes)


# ---------------------------------------------------------------- the deterministic "model"


def write_kv(cache: UnifiedCache, slots: torch.Tensor, tokens: Any, start: int,
             namespace: Any = None) -> None:
    """What a model writes at ``slots`` for positions ``start..len(tokens)`` of the request's
    whole token list ``tokens`` (tests/oracle.py: K/V depend on the whole prefix and on the
    namespace the request lives in, the cache's layered with the request's)."""
    oracle.write(cache, slots, tokens, start, namespace)


def kv_matches(cache: UnifiedCache, slots: torch.Tensor, tokens: Any, start: int,
               namespace: Any = None) -> bool:
    """Whether ``slots`` hold exactly what the model writes for positions
    ``start..len(tokens)`` of the whole token list ``tokens``."""
    return oracle.kv_matches(cache, slots, tokens, start, namespace)


# ---------------------------------------------------------------- checks


def verify_tree(cache: UnifiedCache) -> None:
    """No unverified page in the tree: every cached page holds exactly the K/V the model wrote
    for its node's whole path (root to node end) in its root's namespace."""
    oracle.verify_tree(cache)


def assert_exact(cache: UnifiedCache, *, locks: int = 0) -> None:
    """Invariants hold, nobody but the tree holds a slot, free + cached == total, ``locks``
    lock receipts are live, and every tree page is verified."""
    cache.check_invariants()
    stats = cache.stats()
    assert stats["held_tokens"] == 0, stats
    assert stats["free_tokens"] + stats["cached_tokens"] == stats["total_tokens"], stats
    assert stats["num_locks"] == locks, stats
    verify_tree(cache)


# ---------------------------------------------------------------- one request


def serve(cache: UnifiedCache, tokens: list[int], namespace: Any = None) -> int:
    """One request without a store load (the shared loop of tests/serving.py), checking that
    the device prefix it reuses holds the model's K/V. Returns that device prefix."""
    served = serving.serve(cache, tokens, compute=_model(namespace), namespace=namespace)
    assert served.insert is not None, "no room for the request"
    return served.device_len


def request(cache: UnifiedCache, linker: Any, tokens: list[int], req_id: Any,
            namespace: Any = None) -> dict[str, Any]:
    """The engine's flow: match (+ LOOKUP), load when the store has more, check that what is
    served is exactly the model's K/V, compute the rest, insert, unlock. Never raises for a
    store fault; returns what happened."""
    served = serving.serve(cache, tokens, linker=linker, req_id=req_id,
                           compute=_model(namespace), namespace=namespace)
    assert served.insert is not None, "no room for the request"
    out = served.load
    return {"device": served.device_len, "hit": served.hit_len, "prefix": served.prefix_len,
            "ok": None if out is None else out.ok, "reason": "" if out is None else out.reason}


def _model(namespace: Any) -> serving.Compute:
    """The "model" of a request in ``namespace``: it first checks the reused prefix."""
    def compute(cache: Any, kv: torch.Tensor, tokens: list[int], start: int) -> None:
        assert kv_matches(cache, kv[:start], tokens[:start], 0, namespace), "served wrong K/V"
        write_kv(cache, kv[start:], tokens, start, namespace)
    return compute


# ---------------------------------------------------------------- child processes


def child_env() -> dict[str, str]:
    """Environment for a child Python that imports radixlink and this kit."""
    path = os.pathsep.join([str(REPO_ROOT), str(TESTS_DIR)])
    return {**os.environ, "PYTHONPATH": path}


def run_child(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          timeout=timeout, env=child_env())


def kill(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL a child we started, by PID, and reap it."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def offload(cache: UnifiedCache, linker: Any, tokens: list[int] = TOKENS,
            namespace: Any = None) -> None:
    """Compute ``tokens`` on ``cache`` and wait until write_through has put them in the store."""
    serve(cache, tokens, namespace)
    assert linker.flush(timeout=30)
    node = cache.match_prefix(tokens, namespace=namespace).last_node
    assert node.external_cache_stored, linker.stats()
