"""KV events in vLLM's format: ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` with a
``medium`` (``GPU``, ``CPU``, ``STORAGE``), the one format radixlink's caches emit, its vLLM
connector publishes and its router reads (docs/routing.md, KV events).

Owns the event records, reading vLLM's own events into them, and the queue producers append to.
Must not import vLLM, a cache or a store: producers hand it page hashes.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixlink.hashing import namespace_id as _namespace_id

# vLLM's medium words (vllm.distributed.kv_events): GPU is the pool the model reads (radixlink's
# *device*, whatever the hardware), CPU a host tier, STORAGE a store.
MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"


class KVEventKind(str, enum.Enum):
    """What happened to pages (the producers' word; the record's type says it too)."""

    STORED = "stored"
    REMOVED = "removed"


class Tier(str, enum.Enum):
    """Where the pages are (the fixed tier words of STYLE.md), and vLLM's medium for each."""

    DEVICE = "device"
    HOST = "host"
    STORE = "store"

    @property
    def medium(self) -> str:
        return _MEDIUMS[self]


_MEDIUMS = {Tier.DEVICE: MEDIUM_GPU, Tier.HOST: MEDIUM_CPU, Tier.STORE: MEDIUM_STORAGE}


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockStored:
    """Pages a tier now holds: vLLM's ``BlockStored`` (same field names and meaning; page =
    vLLM block), then where radixlink emitted it.

    Attributes:
        block_hashes: chained page hashes, page 0 first, as hex strings (empty when the cache
            does not hash pages).
        parent_block_hash: the hash of the page before the first one, when known.
        token_ids, block_size: the pages' tokens and tokens per page, when known.
        medium: ``MEDIUM_GPU`` / ``MEDIUM_CPU`` / ``MEDIUM_STORAGE``.
        lora_name, group_idx, locality, ownership: as vLLM's (KV cache group, ``LOCAL`` /
            ``REMOTE``, the tier that emitted it).
        node_id: the emitting engine node (a router's name for the stream it came from).
        namespace_id, tree_node_id, token_range: radixlink's tree: the namespace, the tree
            node and its absolute token range ``[start, end)`` (None once it left the tree).
        timestamp: when it was emitted (``time.time``).
    """

    block_hashes: tuple[str, ...]
    parent_block_hash: str | None = None
    token_ids: tuple[int, ...] = ()
    block_size: int = 0
    medium: str = MEDIUM_GPU
    lora_name: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None
    node_id: str = ""
    namespace_id: str = ""
    tree_node_id: int | None = None
    token_range: tuple[int, int] | None = None
    timestamp: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockRemoved:
    """Pages a tier no longer holds: vLLM's ``BlockRemoved``, then radixlink's fields (as in
    ``BlockStored``)."""

    block_hashes: tuple[str, ...]
    medium: str = MEDIUM_GPU
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None
    node_id: str = ""
    namespace_id: str = ""
    tree_node_id: int | None = None
    token_range: tuple[int, int] | None = None
    timestamp: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class AllBlocksCleared:
    """vLLM's ``AllBlocksCleared``: the node emptied its device prefix cache."""

    node_id: str = ""
    timestamp: float = 0.0


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
_RECORDS = (BlockStored, BlockRemoved, AllBlocksCleared)


def hash_hex(block_hash: Any) -> str:
    """A page hash as radixlink's hex string: vLLM's bytes hashes as their hex, its 64-bit int
    hashes (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``) as 16 hex digits, strings as they are.

    Raises:
        ValueError: any other type (naming it).
    """
    if isinstance(block_hash, str):
        return block_hash
    if isinstance(block_hash, (bytes, bytearray, memoryview)):
        return bytes(block_hash).hex()
    if isinstance(block_hash, int) and not isinstance(block_hash, bool):
        return f"{block_hash & 0xFFFF_FFFF_FFFF_FFFF:016x}"
    raise ValueError(f"a block hash must be bytes, int or a hex string, got "
                     f"{type(block_hash).__name__} {block_hash!r}")


def as_kv_event(event: Any, node_id: str = "") -> KVEvent | None:
    """``event`` as a radixlink record: a record as it is; one of vLLM's event structs, or one
    decoded from vLLM's ZMQ stream without types (a dict with ``"type"``), converted (hashes
    by ``hash_hex``, ``node_id`` stamped); None for anything else (e.g. a newer event type).

    Raises:
        ValueError: a block hash of an unknown type.
    """
    if isinstance(event, _RECORDS):
        return event
    wire = isinstance(event, Mapping)
    kind = event.get("type") if wire else type(event).__name__

    def get(name: str) -> Any:
        return event.get(name) if wire else getattr(event, name, None)

    if kind == "AllBlocksCleared":
        return AllBlocksCleared(node_id=node_id)
    if kind not in ("BlockStored", "BlockRemoved"):
        return None
    common = {"block_hashes": tuple(hash_hex(h) for h in get("block_hashes") or ()),
              "medium": get("medium") or MEDIUM_GPU, "group_idx": get("group_idx"),
              "locality": get("locality"), "ownership": get("ownership"), "node_id": node_id}
    if kind == "BlockRemoved":
        return BlockRemoved(**common)
    parent = get("parent_block_hash")
    return BlockStored(**common, parent_block_hash=None if parent is None else hash_hex(parent),
                       token_ids=tuple(get("token_ids") or ()),
                       block_size=int(get("block_size") or 0), lora_name=get("lora_name"))


class KVEventQueue:
    """A bounded, thread-safe queue of KV events that producers append to and a router
    drains. When full the oldest events are dropped and counted: a router that sees
    ``dropped`` grow must resynchronise (re-read the tiers) instead of trusting its view.

    Args:
        max_events: events kept before the oldest are dropped.
        node_id: stamped on every event (which engine node emitted it).
    """

    def __init__(self, max_events: int = 65536, node_id: str = ""):
        if max_events <= 0:
            raise ValueError(f"max_events must be positive, got {max_events}")
        self.node_id = node_id
        self._events: deque[KVEvent] = deque()
        self._max = max_events
        self._lock = threading.Lock()
        self._emitted = self._dropped = 0

    def emit(self, kind: KVEventKind | str, tier: Tier | str, page_hashes: Sequence[str],
             namespace_id: str = "", *, tree_node_id: int | None = None,
             token_range: tuple[int, int] | None = None) -> None:
        """Append one ``BlockStored`` / ``BlockRemoved`` of ``tier``'s medium (a no-op for no
        pages and no tree node)."""
        if not page_hashes and tree_node_id is None:
            return
        cls = BlockStored if KVEventKind(kind) is KVEventKind.STORED else BlockRemoved
        event = cls(block_hashes=tuple(page_hashes), medium=Tier(tier).medium,
                    namespace_id=namespace_id, node_id=self.node_id, timestamp=time.time(),
                    tree_node_id=tree_node_id, token_range=token_range)
        with self._lock:
            self._events.append(event)
            self._emitted += 1
            if len(self._events) > self._max:
                self._events.popleft()
                self._dropped += 1

    def emit_node(self, kind: KVEventKind | str, tier: Tier | str, node: Any) -> None:
        """One event for a tree node's pages (its hashes, id, range and root's namespace)."""
        root = node
        while root.parent is not None:
            root = root.parent
        alive = node.seq_len >= 0
        ns = _namespace_id(root.namespace) if alive and root is not node else ""
        self.emit(kind, tier, node.hash_value or (), ns, tree_node_id=int(node.node_id),
                  token_range=(node.start, node.seq_len) if alive else None)

    def drain(self, max_events: int | None = None) -> list[KVEvent]:
        """Remove and return the oldest events (all of them by default), in emit order."""
        with self._lock:
            n = len(self._events) if max_events is None else min(max_events, len(self._events))
            return [self._events.popleft() for _ in range(n)]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"emitted": self._emitted, "dropped": self._dropped,
                    "pending": len(self._events)}
