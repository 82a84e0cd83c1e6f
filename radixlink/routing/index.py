"""The router's view of the cluster's caches: which node's device holds which page hashes, and
which pages the shared store holds, kept from the nodes' KV events (radixlink.kvevents: vLLM's
format, from radixlink's caches or from vLLM's own event stream).

Owns that index and the prefix queries on it. Must not read a cache, a linker or a store.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from radixlink.kvevents import (
    MEDIUM_GPU,
    MEDIUM_STORAGE,
    AllBlocksCleared,
    BlockStored,
    as_kv_event,
)


class PrefixIndex:
    """Page hash -> holders. Device holders are kept as one bitmask per page (bit i = node i),
    so a prefix query over all nodes is one pass over the request's pages. Pages a node is
    expected to hold, those of requests routed there and not finished (``expect``), are kept
    the same way, apart from what its events say.

    Events are vLLM's (``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``), as
    radixlink's records, vLLM's own structs or decoded from its ZMQ stream (``as_kv_event``).
    By ``medium``: ``GPU`` is the emitting node's device; ``STORAGE`` is the shared store,
    one store read away on every node, whichever node emitted it (radixlink's linker on
    offload, its vLLM connector on save, load or a bad page's delete); ``CPU`` (a node's host
    tier) is counted as skipped. Only the first KV cache group (``group_idx`` 0 or None: full
    attention) is indexed; other groups' events are skipped. Hashes are hex strings
    (``hash_hex``): a router asks with the same hex page hashes. A store's own LRU evictions
    emit no events: a router that must not over-estimate the store asks the store instead
    (``Router(store_prefix=...)``).

    Args:
        node_ids: the nodes, in position order.
    """

    def __init__(self, node_ids: Sequence[str]):
        if not node_ids or len(set(node_ids)) != len(node_ids):
            raise ValueError(f"node_ids must be non-empty and distinct, got {list(node_ids)}")
        self.node_ids = tuple(str(n) for n in node_ids)
        self._bit = {n: 1 << i for i, n in enumerate(self.node_ids)}
        self._all = (1 << len(self.node_ids)) - 1
        self._device: dict[str, int] = {}
        self._store: set[str] = set()
        self._counts: Counter[str] = Counter()
        self._expected: dict[str, int] = {}  # page hash -> bitmask of nodes expecting it
        self._expecting: Counter[tuple[str, int]] = Counter()  # (page hash, node) -> requests

    def apply(self, events: Iterable[Any], node_id: str | None = None) -> None:
        """Fold events in, in emit order.

        Args:
            events: radixlink records, or vLLM's events (structs or wire dicts).
            node_id: the node that emitted them all (a vLLM stream carries no node id);
                None: each record's own ``node_id``.

        Events of unknown nodes, CPU events, other groups' and unknown event types are
        counted and skipped.
        """
        device, counts = self._device, self._counts
        for raw in events:
            counts["events"] += 1
            event = as_kv_event(raw, node_id or "")
            if event is None:
                counts["skipped"] += 1
                continue
            bit = self._bit.get(event.node_id if node_id is None else node_id)
            if isinstance(event, AllBlocksCleared):
                self._clear_device(bit)
                continue
            if event.group_idx or event.medium not in (MEDIUM_GPU, MEDIUM_STORAGE):
                counts["skipped"] += 1
                continue
            stored = isinstance(event, BlockStored)
            if event.medium == MEDIUM_STORAGE:
                if stored:
                    self._store.update(event.block_hashes)
                else:
                    self._store.difference_update(event.block_hashes)
                continue
            if bit is None:
                counts["skipped"] += 1
                continue
            if stored:
                for h in event.block_hashes:
                    device[h] = device.get(h, 0) | bit
            else:
                for h in event.block_hashes:
                    left = device.get(h, 0) & ~bit
                    if left:
                        device[h] = left
                    else:
                        device.pop(h, None)

    def _clear_device(self, bit: int | None) -> None:
        """The node emptied its device prefix cache (vLLM's ``AllBlocksCleared``)."""
        if bit is None:
            self._counts["skipped"] += 1
            return
        device = self._device
        for h in [h for h, mask in device.items() if mask & bit]:
            left = device[h] & ~bit
            if left:
                device[h] = left
            else:
                del device[h]

    def expect(self, node: int, hashes: Sequence[str]) -> None:
        """A request routed to ``node`` (a position in ``node_ids``) will leave ``hashes`` on
        its device when it finishes; ``unexpect`` with the same pages when it has."""
        bit, expecting, expected = 1 << node, self._expecting, self._expected
        for h in hashes:
            expecting[h, node] += 1
            expected[h] = expected.get(h, 0) | bit

    def unexpect(self, node: int, hashes: Sequence[str]) -> None:
        """Undo one ``expect(node, hashes)``."""
        bit, expecting, expected = 1 << node, self._expecting, self._expected
        for h in hashes:
            left = expecting[h, node] - 1
            if left > 0:
                expecting[h, node] = left
                continue
            del expecting[h, node]
            mask = expected.get(h, 0) & ~bit
            if mask:
                expected[h] = mask
            else:
                expected.pop(h, None)

    def device_prefix_pages(self, hashes: Sequence[str]) -> list[int]:
        """Per node (in ``node_ids`` order), how many leading pages of ``hashes`` its device
        holds."""
        return self._prefix_pages(self._device, hashes)

    def expected_prefix_pages(self, hashes: Sequence[str]) -> list[int]:
        """Per node, how many leading pages of ``hashes`` requests routed there and not
        finished will leave on its device."""
        return self._prefix_pages(self._expected, hashes)

    def _prefix_pages(self, holders: dict[str, int], hashes: Sequence[str]) -> list[int]:
        out = [len(hashes)] * len(self.node_ids)
        alive = self._all
        for i, h in enumerate(hashes):
            held = holders.get(h, 0)
            gone = alive & ~held
            while gone:
                low = gone & -gone
                out[low.bit_length() - 1] = i
                gone ^= low
            alive &= held
            if not alive:
                break
        return out

    def store_prefix_pages(self, hashes: Sequence[str]) -> int:
        """How many leading pages of ``hashes`` the store holds, by its events."""
        for i, h in enumerate(hashes):
            if h not in self._store:
                return i
        return len(hashes)

    def stats(self) -> dict[str, int]:
        """Events applied and skipped; pages indexed on devices, in the store and expected."""
        return {"events": self._counts["events"], "skipped": self._counts["skipped"],
                "device_pages": len(self._device), "store_pages": len(self._store),
                "expected_pages": len(self._expected)}
