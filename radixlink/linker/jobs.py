"""Worker jobs built on the engine thread: a load's (staging frames, a writer into the reserved
slots per pool, its ``LayerProgress``) and an offload batch's (the queued pages the store is
not known to hold, gathered into one staging buffer).

Owns the batch records, the choice of pages and the moves between pools and staging, through
the pools' one byte-I/O protocol (``memory.pools.PagePool``: page ids, gather, stage, scatter),
whatever a pool holds. Must not touch the tree: it reads the transfers the component hooks
built.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from radixlink.contract import PoolName, PoolTransfer
from radixlink.linker.progress import LayerProgress
from radixlink.linker.worker import Job, PoolPages, TransferKind
from radixlink.memory.host import StagingArena
from radixlink.memory.pools import PagePool
from radixlink.stores.frames import Frames
from radixlink.stores.pageio import Codec, PageKeys, stage_pages
from radixlink.tree.stored import StoredPages

CodecOf = Callable[[PoolName], Codec]


class PoolPart:
    """One pool's pages of a batch being gathered: keys to write, their page hashes (what
    the record of known pages names them by; a sequence per transfer), and where their data
    is."""

    __slots__ = ("pool", "keys", "hashes", "parts")

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.keys: list[str] = []
        self.hashes: list[Sequence[str]] = []
        self.parts: list[Any] = []  # page ids (``pool.page_ids``), one array per transfer


class Batch:
    """Offloads queued since the last flush: their nodes (marked in flight with ``ticket``)
    and each node's transfers as they were when queued."""

    __slots__ = ("ticket", "nodes", "transfers", "num_pages", "num_bytes")

    def __init__(self, ticket: int) -> None:
        self.ticket = ticket
        self.nodes: list[Any] = []
        self.transfers: list[tuple[Any, PoolTransfer]] = []  # (namespace, transfer)
        self.num_pages = 0
        self.num_bytes = 0


def select_pages(batch: Batch, cache: Any, keyspace: PageKeys, known: StoredPages,
                 skip: set[PoolName]) -> tuple[dict[PoolName, PoolPart], float | None]:
    """Per pool, the keys, page hashes and page ids of the batch's pages not known to be
    stored (pools in ``skip`` are written by another rank); and since when the skipped
    pages are known (None when some page of the batch is not)."""
    parts: dict[PoolName, PoolPart] = {}
    oldest: float | None = time.monotonic()
    for namespace, transfer in batch.transfers:
        name = transfer.name
        if name in skip:
            continue
        todo, hashes, since = known.unknown(name, transfer.keys)
        if since is not None and oldest is not None:
            oldest = min(oldest, since)
        if todo is not None and not todo:
            continue
        part = parts.get(name)
        if part is None:
            part = parts[name] = PoolPart(cache.pool(name))
        part.keys += keyspace.keys(name, namespace, hashes)
        part.hashes.append(hashes)
        _add_pages(part, transfer.device_indices, todo)
    return parts, oldest


def offload_job(parts: dict[PoolName, PoolPart], cache: Any, codec_of: CodecOf,
                arena: StagingArena, stream: Any) -> tuple[Job, Any]:
    """Copy every part's pages into one staging buffer (frames per pool) and wrap them in an
    offload job; on CUDA (``stream``) the copies run on that side stream after the model's
    writes, and the returned event says when they landed."""
    if not parts:
        return Job(kind=TransferKind.OFFLOAD, pools=[]), None
    names = list(parts)
    wanted = []
    for name in names:
        wanted.append((codec_of(name), parts[name].keys))
    staging, staged = stage_pages(arena, wanted)
    pools = []
    for name, part in zip(names, staged):
        pools.append(PoolPages(name=name, keys=part.keys, codec=part.codec, frames=part.frames))
    ready = None
    if stream is None:
        for pool in pools:
            gather_pages(parts[pool.name].pool, parts[pool.name].parts, pool.frames)
    else:
        stream.wait_stream(torch.cuda.current_stream(stream.device))
        with torch.cuda.stream(stream):
            for pool in pools:
                gather_pages(parts[pool.name].pool, parts[pool.name].parts, pool.frames)
            ready = torch.cuda.Event()
            ready.record(stream)
    return Job(kind=TransferKind.OFFLOAD, pools=pools, staging=staging, ready=ready), ready


def load_job(transfers: list[PoolTransfer], cache: Any, codec_of: CodecOf,
             keyspace: PageKeys, namespace: Any, arena: StagingArena) -> Job:
    """The worker job of a load: per pool its keys (``keyspace``'s, in the lookup's resolved
    ``namespace``), codec, staging frames and a writer into the reserved slots; on CUDA its
    own stream; a ``LayerProgress`` for layer-wise engines."""
    wanted = []
    for t in transfers:
        wanted.append((codec_of(t.name), keyspace.keys(t.name, namespace, t.keys)))
    staging, staged = stage_pages(arena, wanted)
    pools = []
    layers: dict[PoolName, int] = {}
    for t, part in zip(transfers, staged):
        land, layers[t.name] = pool_lander(cache.pool(t.name), t, part.frames)
        pools.append(PoolPages(name=t.name, keys=part.keys, codec=part.codec,
                               frames=part.frames, land=land, num_layers=layers[t.name]))
    stream = None
    if cache.device.type == "cuda":  # NOTE: loads land on their own stream
        stream = torch.cuda.Stream(cache.device)
    return Job(kind=TransferKind.LOAD, pools=pools, staging=staging, stream=stream,
               progress=LayerProgress(layers))


def _add_pages(part: PoolPart, slots: Any, todo: list[int] | None) -> None:
    """Append where the pages ``todo`` (None: all) of one transfer live to ``part``."""
    pages = part.pool.page_ids(slots)
    if todo is not None:
        pages = pages[todo if isinstance(pages, np.ndarray) else
                      torch.tensor(todo, dtype=torch.int64, device=pages.device)]
    part.parts.append(pages)


def gather_pages(pool: PagePool, parts: list[Any], frames: Frames) -> None:
    """Copy pages out of ``pool`` into the payloads of ``frames``: ``parts`` are page ids
    (``pool.page_ids``), in frame order. On CUDA the copy is only queued on the current
    stream."""
    payloads = frames.payloads()
    if len(parts) == 1:
        pool.gather(parts[0], payloads)
    elif isinstance(parts[0], np.ndarray):
        pool.gather(np.concatenate(parts), payloads)
    else:
        pool.gather(torch.cat(parts), payloads)


def pool_lander(pool: PagePool, transfer: PoolTransfer,
                frames: Frames) -> tuple[Callable[[int | None], None], int]:
    """A function writing the verified payloads of ``frames`` into the transfer's reserved
    slots (one layer, or all with None; called on a worker thread: the slots are reserved,
    nobody else uses them), and the pool's layer count (0: it lands whole)."""
    slots = transfer.device_indices
    assert slots is not None, f"LOAD transfer of {transfer.name} has no device slots"
    pages, payloads = pool.page_ids(slots), frames.payloads()
    staged: list[torch.Tensor] = []

    def land(layer: int | None) -> None:
        if not staged:  # NOTE: one host-to-device copy of all pages, then a scatter per layer
            staged.append(pool.stage(payloads))
        pool.scatter(pages, staged[0], layer)

    return land, pool.land_layers
