"""The linker's transfer-engine jobs (``pages.engine``), built on the engine thread: a load's
(staging frames and ``PoolLanding``, which writes the verified pages into the reserved slots
and tells the load's ``LayerProgress``) and an offload batch's (the queued pages the store is
not known to hold, gathered into one staging buffer).

Owns the batch records, the choice of pages and the moves between pools and staging, through
the pools' one byte-I/O protocol (``memory.pools.PagePool``: page ids, gather, stage,
scatter), whatever a pool holds. Must not touch the tree: it reads the transfers the component
hooks built.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from radixlink.contract import PoolName, PoolTransfer
from radixlink.linker.progress import LayerProgress
from radixlink.memory.pools import PagePool
from radixlink.pages.engine import Completion, Job, TransferKind
from radixlink.pages.keys import PageKeys
from radixlink.pages.pageio import Codec, stage_pages
from radixlink.pages.staging import Frames, StagingArena
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
        part.keys += keyspace.keys(name, hashes, namespace)
        part.hashes.append(hashes)
        _add_pages(part, transfer.device_indices, todo)
    return parts, oldest


def offload_job(parts: dict[PoolName, PoolPart], codec_of: CodecOf, arena: StagingArena,
                stream: Any) -> Job:
    """Copy every part's pages into one staging buffer (frames per pool) and wrap them in an
    offload job; on CUDA (``stream``) the copies run on that side stream after the model's
    writes, and the job's ``ready`` event says when they landed."""
    if not parts:
        return Job(kind=TransferKind.OFFLOAD, parts=[])
    staging, staged = stage_pages(arena, [(codec_of(name), part.keys)
                                          for name, part in parts.items()])
    ready = []
    if stream is None:
        for part, into in zip(parts.values(), staged):
            gather_pages(part.pool, part.parts, into.frames)
    else:
        stream.wait_stream(torch.cuda.current_stream(stream.device))
        with torch.cuda.stream(stream):
            for part, into in zip(parts.values(), staged):
                gather_pages(part.pool, part.parts, into.frames)
            ready.append(torch.cuda.Event())
            ready[0].record(stream)
    return Job(kind=TransferKind.OFFLOAD, parts=staged, staging=staging, ready=ready)


class PoolLanding:
    """Where one load lands: per pool its page ids and the verified payloads in staging, and
    the load's ``LayerProgress`` (a ``pages.engine.Landing``). ``land`` (on an I/O thread: the
    slots are reserved, nobody else uses them) writes pools that land whole (states) first, then
    layer by layer when someone ``watch``es the progress (a layer-wise engine), telling the
    progress after each; on CUDA on the load's own stream, finished before it returns."""

    def __init__(self, cache: Any, transfers: list[PoolTransfer], frames: list[Frames]):
        self.moves: list[tuple[PoolName, PagePool, Any, torch.Tensor]] = []
        for t, part in zip(transfers, frames):
            assert t.device_indices is not None, f"LOAD transfer of {t.name} has no slots"
            pool = cache.pool(t.name)
            self.moves.append((t.name, pool, pool.page_ids(t.device_indices), part.payloads()))
        self.progress = LayerProgress({name: pool.land_layers for name, pool, _, _ in self.moves})
        self.stream = torch.cuda.Stream(cache.device) if cache.device.type == "cuda" else None

    def land(self, cancelled: Callable[[], bool]) -> bool:
        """Write every pool; False when cancelled between layers."""
        if self.stream is None:
            return self._land(cancelled)
        with torch.cuda.stream(self.stream):  # type: ignore[attr-defined]
            landed = self._land(cancelled)
        self.stream.synchronize()  # NOTE: publish (on the engine thread) follows the verdict
        return landed

    def _land(self, cancelled: Callable[[], bool]) -> bool:
        progress, per_layer = self.progress, self.progress.watched
        layered, num_layers = [], 0
        for name, pool, pages, payloads in self.moves:
            staged = pool.stage(payloads)  # NOTE: one host-to-device copy, then per layer
            if pool.land_layers and per_layer:
                layered.append((name, pool, pages, staged))
                num_layers = max(num_layers, pool.land_layers)
                continue
            pool.scatter(pages, staged, None)
            progress.land(name, None, self._event())
        for layer in range(num_layers):
            if layer and cancelled():
                return False
            for name, pool, pages, staged in layered:
                if layer < pool.land_layers:
                    pool.scatter(pages, staged, layer)
                    progress.land(name, layer, self._event())
        return True

    def early(self) -> bool:
        """Land before the verdict when a layer-wise engine waits on the progress."""
        return self.progress.watched

    def fail(self, done: Completion) -> None:
        """A load that did not land fails every layer-wise waiter."""
        self.progress.fail()

    def _event(self) -> Any:
        """A CUDA event recorded on the load's stream now, or None on CPU."""
        if self.stream is None:
            return None
        event = torch.cuda.Event()  # type: ignore[attr-defined]
        event.record(self.stream)
        return event


def load_job(transfers: list[PoolTransfer], cache: Any, codec_of: CodecOf, keyspace: PageKeys,
             namespace: Any, arena: StagingArena) -> tuple[Job, PoolLanding]:
    """The engine job of a load: per pool its keys (``keyspace``'s, in the lookup's resolved
    ``namespace``), codec and staging frames, landed by a ``PoolLanding``."""
    staging, parts = stage_pages(arena, [(codec_of(t.name), keyspace.keys(t.name, t.keys,
                                                                          namespace))
                                         for t in transfers])
    landing = PoolLanding(cache, transfers, [part.frames for part in parts])
    return Job(kind=TransferKind.LOAD, parts=parts, staging=staging, land=landing), landing


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
