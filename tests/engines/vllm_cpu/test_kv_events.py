"""Real vLLM on CPU (SmolLM2-135M, fp32) publishing the shared store's KV events on its own ZMQ
publisher (``kv_events_config``), read with vLLM's own msgspec event types: after a prompt the
``STORAGE`` ``BlockStored`` events name exactly the pages the store holds, with the hashes of
vLLM's own GPU events for the same blocks; a healed bad page is removed, then stored again; a
second engine's events agree; an operator's ``radixlink store clear`` is published by both.

Two engines, each a fresh process stopped by PID; each publishes to its own SUB socket bound on
a free loopback port (the publisher connects: vLLM binds only wildcard endpoints).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .conftest import tokenizer_of
from .kit import shared_prefix_prompts

BLOCK = 32  # NOTE: the smallest block vLLM CPU's attention takes (multiples of 32)
PAGES = 6  # a 200-token prompt: 6 whole pages (the lookup keeps one token to compute)
NEW_TOKENS = 8  # 208 tokens: no output page completes, so every page is a prompt page
PUMP_PROMPT = [1, 2, 3]  # shorter than a page: steps the engine, stores and emits nothing


class Subscriber:
    """A SUB socket on a free loopback port, decoding vLLM's ``KVEventBatch`` frames."""

    def __init__(self) -> None:
        import msgspec
        import zmq
        from vllm.distributed.kv_events import KVEventBatch

        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind("tcp://127.0.0.1:0")
        self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.events: list[Any] = []

    def attach(self) -> None:
        """Once the engine is up (its PUB connected while it started): let the socket take
        the connection and send its subscription. NOTE: libzmq attaches a new peer only when
        the socket's own thread calls into it; a PUB drops what it sends before the
        subscription arrives, so without this the first prompt's events were lost."""
        self._sock.poll(200)

    def drain(self, wait_s: float = 0.3) -> list[Any]:
        """Every batch that arrives within ``wait_s`` of the last one; their events."""
        got: list[Any] = []
        while self._sock.poll(int(wait_s * 1000)):
            _topic, _seq, payload = self._sock.recv_multipart()
            got += self._decoder.decode(payload).events
        self.events += got
        return got

    def close(self) -> None:
        self._sock.close()
        self._ctx.term()


def _hashes(events: list[Any], kind: str, medium: str) -> list[str]:
    from radixlink.kvevents import hash_hex

    return [hash_hex(h) for e in events if type(e).__name__ == kind
            and getattr(e, "medium", None) == medium for h in e.block_hashes]  # fmt: skip


def _as_event_hash(page_hash: str) -> str:
    """A store key's page hash as vLLM's events carry it (the low 64 bits by default)."""
    from vllm import envs

    return page_hash[-16:] if envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES else page_hash


def _store_pages(url: str) -> dict[str, str]:
    """Event hash -> store key of every page the store holds."""
    from radixlink.stores import open_store
    from radixlink.stores.keys import parse_key

    with open_store(url) as store:
        keys = [key for key, _ in store.scan("") if parse_key(key) is not None]
    return {_as_event_hash(parse_key(k).page_hash): k for k in keys}  # type: ignore[union-attr]


def _until(node: Any, sub: Subscriber, done: Callable[[list[Any]], bool],
           timeout_s: float = 90.0) -> list[Any]:  # fmt: skip
    """Events until ``done(all events so far)``: a save that ends after the engine's last step
    is published with its next one, so an idle engine is stepped by a prompt shorter than a
    page."""
    got = sub.drain()
    deadline = time.monotonic() + timeout_s
    while not done(got):
        assert time.monotonic() < deadline, f"events never complete: {_log(got)}"
        node.generate([PUMP_PROMPT], 1)
        got += sub.drain()
    return got


def _outputs(reply: dict[str, Any]) -> list[list[int]]:
    return [r["output_ids"] for r in reply["results"]]


def _log(events: list[Any]) -> str:
    """One line per event: type, medium, hashes (first 8 digits), tokens, fields."""
    from radixlink.kvevents import hash_hex

    lines = []
    for e in events:
        name = type(e).__name__
        hashes = " ".join(hash_hex(h)[:8] for h in getattr(e, "block_hashes", ()))
        extra = ""
        if name == "BlockStored":
            parent = e.parent_block_hash
            extra = (f" parent={'-' if parent is None else hash_hex(parent)[:8]} "
                     f"tokens={len(e.token_ids)} block_size={e.block_size}")
        for field in ("group_idx", "locality", "ownership"):
            if getattr(e, field, None) is not None:
                extra += f" {field}={getattr(e, field)}"
        lines.append(f"{name:<16} {getattr(e, 'medium', '') or '':<7} [{hashes}]{extra}")
    return "\n".join(lines)


def _spec(model: str, store: str, endpoint: str) -> Any:
    from radixlink.integrations.vllm.nodes import NodeSpec, connector_config

    return NodeSpec(model=model, kv_transfer_config=connector_config(store), block_size=BLOCK,
                    kv_events_config={"enable_kv_cache_events": True, "publisher": "zmq",
                                      "endpoint": endpoint})  # fmt: skip


def test_storage_events_follow_the_store(smollm2: str, start_node: Any, logs: Path,
                                         tmp_path: Path) -> None:  # fmt: skip
    """Flow: engine A computes a 200-token prompt (HF transformers' greedy output, not
    degenerate) and saves its 6 pages: its STORAGE BlockStored events name exactly the
    store's 6 pages, with the hashes and tokens of its GPU events for those blocks. Page 3 is
    corrupted; A's device cache is reset and the prompt reloaded: BlockRemoved of page 3,
    then BlockStored of it again (healed), same output. Engine B loads the 6 pages: its
    STORAGE events (verified loads) and GPU events name the same hashes. radixlink's router
    index, fed both streams, sees the prefix one store read away on both nodes and on both
    devices. ``radixlink store clear`` then makes both publish the 6 pages' removal."""
    from radixlink.routing import PrefixIndex
    from radixlink.stores.admin import main as store_cli

    from .reference import degenerate, hf_greedy

    prompt = shared_prefix_prompts(tokenizer_of(smollm2), num=1, prefix_len=150,
                                   total_len=200, seed=3).prompts[0]
    expected = hf_greedy(smollm2, [prompt], NEW_TOKENS)[0]
    assert not degenerate(expected)
    store = f"file://{tmp_path}/store"
    sub_a, sub_b = Subscriber(), Subscriber()
    try:
        # NOTE: both engines start at once (B idles until A is done): two starts side by side
        # take about one start's wall time more than one, not two
        with ThreadPoolExecutor(2) as pool:
            starting = [pool.submit(start_node, _spec(smollm2, store, sub.endpoint), name)
                        for sub, name in ((sub_a, "events-a"), (sub_b, "events-b"))]
            a, b = (f.result() for f in starting)
        sub_a.attach()
        sub_b.attach()
        assert _outputs(a.generate([prompt], NEW_TOKENS)) == [expected]
        pages = _store_pages(store)
        assert len(pages) == PAGES
        first = _until(a, sub_a, lambda ev: len(_hashes(ev, "BlockStored", "STORAGE")) >= PAGES)
        (logs / "kv-events-one-prompt.log").write_text(_log(first) + "\n")
        print(f"\nKV events of one prompt (engine A):\n{_log(first)}")
        storage = _hashes(first, "BlockStored", "STORAGE")
        gpu = _hashes(first, "BlockStored", "GPU")
        assert sorted(storage) == sorted(pages) and storage == gpu[:PAGES]
        stored = [e for e in first if type(e).__name__ == "BlockStored"]
        by_medium = {m: [t for e in stored if e.medium == m for t in e.token_ids]
                     for m in ("GPU", "STORAGE")}  # fmt: skip
        assert by_medium["STORAGE"] == by_medium["GPU"][: PAGES * BLOCK] == prompt[:192]
        assert {(e.locality, e.ownership) for e in stored if e.medium == "STORAGE"} == {
            ("LOCAL", "radixlink")}
        assert not _hashes(first, "BlockRemoved", "STORAGE")

        _flip_last_byte(store, pages[storage[3]])
        assert a.reset_prefix_cache()
        assert _outputs(a.generate([prompt], NEW_TOKENS)) == [expected]
        healed = _until(a, sub_a, lambda ev: storage[3] in _after_removal(ev, storage[3]))
        assert _hashes(healed, "BlockRemoved", "STORAGE") == [storage[3]]
        print(f"KV events of the heal (engine A):\n{_log(healed)}")
        assert _store_pages(store).keys() == pages.keys()

        assert _outputs(b.generate([prompt], NEW_TOKENS)) == [expected]
        second = _until(b, sub_b, lambda ev: len(_hashes(ev, "BlockStored", "STORAGE")) >= PAGES)
        assert _hashes(second, "BlockStored", "STORAGE") == storage
        assert _hashes(second, "BlockStored", "GPU")[:PAGES] == gpu[:PAGES]

        index = PrefixIndex(["a", "b"])
        index.apply(sub_a.events, node_id="a")
        index.apply(sub_b.events, node_id="b")
        assert index.store_prefix_pages(storage) == PAGES
        assert index.device_prefix_pages(storage) == [PAGES, PAGES]

        assert store_cli(["clear", store, "--all", "--yes"]) == 0
        for node, sub, name in ((a, sub_a, "a"), (b, sub_b, "b")):
            cleared = _until(node, sub, lambda ev: len(_hashes(ev, "BlockRemoved",
                                                               "STORAGE")) >= PAGES)
            assert sorted(_hashes(cleared, "BlockRemoved", "STORAGE")) == sorted(storage)
            index.apply(cleared, node_id=name)
        assert index.store_prefix_pages(storage) == 0
        for sub, name in ((sub_a, "a"), (sub_b, "b")):
            (logs / f"kv-events-{name}.log").write_text(_log(sub.events) + "\n")
    finally:
        sub_a.close()
        sub_b.close()


def _after_removal(events: list[Any], page: str) -> list[str]:
    """STORAGE hashes stored after ``page``'s first STORAGE removal (none before it)."""
    removed = [i for i, e in enumerate(events) if type(e).__name__ == "BlockRemoved"
               and e.medium == "STORAGE" and page in _hashes([e], "BlockRemoved", "STORAGE")]
    return _hashes(events[removed[0] + 1:], "BlockStored", "STORAGE") if removed else []


def _flip_last_byte(url: str, key: str) -> None:
    from radixlink.stores import open_store

    with open_store(url) as store:
        blob = bytearray(store.get([key])[0])  # type: ignore[arg-type]
        blob[-1] ^= 0xFF
        assert store.put({key: bytes(blob)}) == [True]

