"""The replay loop of `radixlink bench trace`: one configuration (capacity, nodes, mode) over
the real ``UnifiedCache`` and, in shared mode, one ``MemoryStore`` behind every node's linker;
and the hit-ratio plot.

Owns the per-request serve protocol of the benchmark. Uses public cache/linker methods only.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import InsertParams
from radixlink.linker.core import ExternalCacheLinker
from radixlink.memory.layout import KVLayout
from radixlink.stores.memory import MemoryStore
from radixlink.stores.pageformat import HEADER_BYTES

_NO_LIMIT = 1 << 62


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayConfig:
    """One replayed configuration.

    Attributes:
        page_size: tokens per page of every device cache.
        capacity: device tokens per node (a page multiple), or None = never evict.
        nodes: device caches; requests go to ``routes[i]``.
        route: routing policy name (reported only; the routes are given).
        mode: ``local`` (device caches only, indices only) or ``shared`` (+ one store).
        store_capacity: tokens the shared store holds (LRU), or None = unbounded.
        hash_algo: page hash of the shared mode.
        ref_bytes_per_token: bytes a reference model moves per token (for the byte figures).
    """

    page_size: int
    capacity: int | None
    nodes: int = 1
    route: str = "round-robin"
    mode: str = "local"
    store_capacity: int | None = None
    hash_algo: str = "sha256"
    ref_bytes_per_token: int = 131072

    @property
    def layout(self) -> KVLayout | None:
        """Shared mode: the smallest real layout (2 bytes per token), so pages have bytes that
        the codec checksums and the store counts; local mode manages indices only."""
        if self.mode == "local":
            return None
        return KVLayout(num_layers=1, num_kv_heads=1, head_dim=1, dtype=torch.uint8,
                        page_size=self.page_size)


@dataclass(slots=True)
class _Node:
    cache: UnifiedCache
    linker: ExternalCacheLinker | None
    capacity: int


def _build_nodes(cfg: ReplayConfig, needs: Sequence[int]) -> tuple[list[_Node], Any]:
    """Per node a cache of ``cfg.capacity`` tokens (or its own total need for inf)."""
    if cfg.mode not in ("local", "shared"):
        raise ValueError(f"mode must be 'local' or 'shared', got {cfg.mode!r}")
    layout = cfg.layout
    store = None
    if layout is not None:
        pages = _NO_LIMIT if cfg.store_capacity is None else cfg.store_capacity // cfg.page_size
        store = MemoryStore(min(_NO_LIMIT, pages * (layout.page_bytes + HEADER_BYTES)) or 1)
    nodes = []
    for need in needs:
        tokens = cfg.capacity if cfg.capacity is not None else max(need, cfg.page_size)
        cache = UnifiedCache(CacheConfig(
            page_size=cfg.page_size, num_tokens=tokens, kv_layout=layout,
            enable_external_cache_linker=layout is not None, hash_algo=cfg.hash_algo))
        linker = None if store is None else ExternalCacheLinker(cache, store)
        nodes.append(_Node(cache, linker, tokens))
    return nodes, store


def serve(node: _Node, prompt: np.ndarray, req_id: int, counts: Counter[str]) -> None:
    """One request: device match (+ store lookup and load), compute the rest, insert the
    prompt's whole pages, free the partial tail, unlock; wait for the offloads it started."""
    cache, ps = node.cache, node.cache.page_size
    key = prompt[: node.capacity]  # NOTE: a node never holds more than its capacity of a prompt
    m = cache.match_prefix(key, req_id=req_id if node.linker is not None else None)
    prefix, slots = m.prefix_len, m.device_indices
    counts["device_hit_tokens"] += prefix
    if m.external_hit_len and node.linker is not None:
        if node.linker.load(req_id):
            out = node.linker.wait_load(req_id)
            handle, prefix, slots = out.lock, out.prefix_len, out.device_indices
            counts["store_hit_tokens"] += out.loaded_len
            counts["failed_loads"] += not out.ok
        else:
            handle = cache.lock(m.last_node)
            counts["refused_loads"] += 1
    else:
        handle = cache.lock(m.last_node)
    new = cache.alloc(len(key) - prefix)
    if new is None:
        # NOTE: a lock protects the whole node the match ended in (match never splits), which
        # may leave less room than capacity - prefix: cache only what fits, as a prefix.
        key = key[: prefix + cache.stats()["free_tokens"]]
        new = cache.alloc(len(key) - prefix)
        assert new is not None, f"alloc failed after eviction: {cache.stats()}"
    kv = torch.cat([slots, new]) if prefix else new
    aligned = len(key) // ps * ps
    cache.insert(InsertParams(key=key, value=kv[:aligned], prev_prefix_len=prefix))
    if kv.shape[0] > aligned:
        cache.free(kv[aligned:])
    cache.unlock(handle)
    counts["truncated_prompts"] += len(key) < len(prompt)
    if node.linker is not None:
        node.linker.flush()  # NOTE: the store state after each request is then deterministic


def replay(requests: Sequence[Any], routes: Sequence[int], tokens: Any, cfg: ReplayConfig,
           progress: bool = False) -> dict[str, Any]:
    """Replay ``requests`` (``TraceRequest``) on ``cfg.nodes`` caches; one result row.

    Args:
        requests: the trace.
        routes: node of each request.
        tokens: a ``BlockTokens`` (request -> prompt tokens).
        cfg: the configuration.
        progress: show a tqdm bar on stderr (when tqdm is installed).
    """
    ps = cfg.page_size
    needs = [0] * cfg.nodes
    for req, node in zip(requests, routes):
        needs[node] += -(-req.input_len // ps) * ps
    nodes, store = _build_nodes(cfg, needs)
    counts: Counter[str] = Counter()
    start = time.perf_counter()
    for i, req in enumerate(_progress(requests, cfg, progress)):
        serve(nodes[routes[i]], tokens.prompt(req), i, counts)
    wall = time.perf_counter() - start
    linker_stats: Counter[str] = Counter()
    for item in nodes:
        stats = item.cache.stats()
        assert stats["held_tokens"] == 0 and stats["num_locks"] == 0, f"leak: {stats}"
        if item.linker is not None:
            linker_stats.update({k: v for k, v in item.linker.stats().items()
                                 if isinstance(v, int)})
            item.linker.close()
    if store is not None:
        store_stats = store.stats()
        store.close()
    input_tokens = sum(r.input_len for r in requests)
    hits = counts["device_hit_tokens"] + counts["store_hit_tokens"]
    offloaded = linker_stats["offloaded_pages"] * ps
    return {
        "capacity_tokens": cfg.capacity, "nodes": cfg.nodes, "route": cfg.route,
        "mode": cfg.mode, "page_size": ps, "store_capacity_tokens": cfg.store_capacity,
        "requests": len(requests), "input_tokens": input_tokens,
        "device_hit_tokens": counts["device_hit_tokens"],
        "store_hit_tokens": counts["store_hit_tokens"],
        "hit_ratio": hits / input_tokens if input_tokens else 0.0,
        "device_hit_ratio": counts["device_hit_tokens"] / max(input_tokens, 1),
        "store_hit_ratio": counts["store_hit_tokens"] / max(input_tokens, 1),
        "computed_tokens": input_tokens - hits,
        "load_bytes": counts["store_hit_tokens"] * cfg.ref_bytes_per_token,
        "offload_bytes": offloaded * cfg.ref_bytes_per_token,
        "refused_loads": counts["refused_loads"], "failed_loads": counts["failed_loads"],
        "truncated_prompts": counts["truncated_prompts"],
        "store_evicted_pages": store_stats["evicted"] if store is not None else 0,
        "offloaded_pages": linker_stats["offloaded_pages"],
        "offloaded_pages_per_request": linker_stats["offloaded_pages"] / max(len(requests), 1),
        "known_pages_skipped": linker_stats["known_pages_skipped"],
        "wall_s": wall, "requests_per_s": len(requests) / wall if wall > 0 else 0.0,
    }


def _progress(requests: Sequence[Any], cfg: ReplayConfig, enabled: bool) -> Any:
    if not enabled:
        return requests
    try:
        from tqdm import tqdm
    except ImportError:
        return requests
    cap = "inf" if cfg.capacity is None else f"{cfg.capacity:,}"
    return tqdm(requests, desc=f"{cfg.mode} x{cfg.nodes} cap {cap}", unit="req", leave=False,
                mininterval=0.5)


def plot_hit_ratio(results: Sequence[dict[str, Any]], path: str, title: str) -> None:
    """Hit ratio vs device capacity per node (log x), one line per (mode, nodes); unbounded
    capacities as dashed horizontal lines, the trace's bound dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in results:
        groups.setdefault((row["mode"], row["nodes"]), []).append(row)
    for (mode, nodes), rows in sorted(groups.items()):
        finite = sorted((r for r in rows if r["capacity_tokens"]),
                        key=lambda r: r["capacity_tokens"])
        label = f"{mode}, {nodes} node{'s' * (nodes > 1)}"
        style = "-o" if mode == "shared" else "--s"
        line = None
        if finite:
            (line,) = ax.plot([r["capacity_tokens"] for r in finite],
                              [r["hit_ratio"] for r in finite], style, label=label)
        for r in rows:
            if not r["capacity_tokens"]:
                ax.axhline(r["hit_ratio"], linestyle=(0, (4, 3)), linewidth=1,
                           color=None if line is None else line.get_color(),
                           label=f"{label}, capacity inf")
    top = max([r["hit_ratio"] for r in results] + [r["upper_bound"] for r in results] + [0.1])
    if results:
        ax.axhline(results[0]["upper_bound"], color="gray", linestyle=":",
                   label=f"trace bound {results[0]['upper_bound']:.3f}")
    ax.set_ylim(0, min(1.0, top * 1.25))
    caps = sorted({r["capacity_tokens"] for r in results if r["capacity_tokens"]})
    ax.set_xscale("log")
    if caps:
        ax.set_xticks(caps)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_tokens_label))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("device capacity per node (tokens)")
    ax.set_ylabel("prefix hit ratio (hit tokens / input tokens)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _tokens_label(value: float, _pos: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if value >= scale:
            return f"{value / scale:g}{unit}"
    return f"{value:g}"
