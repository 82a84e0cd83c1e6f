"""KV events of the shared store through vLLM's own event path: workers report in
``KVConnectorOutput.kv_cache_events``, vLLM's ``KVOutputAggregator`` merges the ranks, the
scheduler-side connector's ``take_events`` builds ``BlockStored`` / ``BlockRemoved`` (medium
``STORAGE``), and vLLM's scheduler publishes them beside its own GPU events. Each published
batch goes through msgpack and back with vLLM's own event types, as its ZMQ publisher and a
subscriber do."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from .conftest import VLLM_MISSING  # noqa: E402, I001

pytest.importorskip("vllm", reason=VLLM_MISSING)

import msgspec  # noqa: E402
from vllm.distributed.kv_events import (  # noqa: E402
    BlockRemoved,
    BlockStored,
    EventPublisher,
    KVEventBatch,
)

from radixlink.integrations.vllm import events as events_module  # noqa: E402
from radixlink.integrations.vllm.reports import RadixlinkKVEvents, StoreReport  # noqa: E402
from radixlink.kvevents import hash_hex  # noqa: E402
from radixlink.routing import PrefixIndex  # noqa: E402
from radixlink.stores import open_store  # noqa: E402
from radixlink.stores.admin import main as store_cli  # noqa: E402
from radixlink.stores.keys import parse_key  # noqa: E402

from .harness import BLOCK  # noqa: E402
from .test_failures import _flip_payload_byte  # noqa: E402
from .test_round_trip import _prompt  # noqa: E402

PAGES = 12  # a 200-token prompt: 12 whole pages of 16 (the lookup keeps one token)


class Recorder(EventPublisher):
    """vLLM's publisher interface: each batch is encoded as ZmqEventPublisher encodes it and
    decoded with vLLM's types, as a subscriber does; the decoded events are kept."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[Any] = []
        self._decoder = msgspec.msgpack.Decoder(type=KVEventBatch)

    def publish(self, events: Any) -> None:
        batch = self._decoder.decode(msgspec.msgpack.encode(events))
        self.events.extend(batch.events)

    def shutdown(self) -> None:
        return

    def take(self) -> list[Any]:
        out, self.events = self.events, []
        return out


def _node(nodes: Any, model_dir: str, url: str, **kwargs: Any) -> tuple[Any, Recorder]:
    node = nodes(model_dir, url, kv_events=True, **kwargs)
    recorder = Recorder()
    node.scheduler.kv_event_publisher = recorder
    return node, recorder


def _hashes(events: list[Any], cls: type, medium: str) -> list[str]:
    return [hash_hex(h) for e in events if isinstance(e, cls) and e.medium == medium
            for h in e.block_hashes]  # fmt: skip


def _stored_pages(url: str) -> set[str]:
    """The store's page hashes as vLLM's events carry them: with its default int hashes
    (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``) the low 64 bits, the last 16 hex digits."""
    with open_store(url) as store:
        parts = [parse_key(key) for key, _ in store.scan("")]
    return {_as_event_hash(p.page_hash) for p in parts if p is not None}


def _as_event_hash(page_hash: str) -> str:
    from vllm import envs

    return page_hash[-16:] if envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES else page_hash


def _serve(node: Any, recorder: Recorder, req_id: str, prompt: list[int]) -> list[Any]:
    node.add(req_id, prompt)
    node.run()
    node.step()  # NOTE: saves that ended after the last step are reported with the next one
    return recorder.take()


def test_saved_pages_are_storage_events_with_vllms_block_hashes(nodes, model_dir, file_url):
    """Flow: node 1 computes a 200-token prompt and saves 12 pages; its STORAGE BlockStored
    events name exactly the 12 pages the store holds, with the block hashes of vLLM's own GPU
    events for the same blocks, chained from no parent, with the pages' tokens, locality
    LOCAL (a directory) and ownership radixlink. radixlink's router index, fed the same
    stream, sees the 12 pages one store read away. A fresh node 2 loads the 12 pages: its
    STORAGE events (verified loads) and its GPU events agree with node 1's."""
    prompt = _prompt(70, 200)
    node1, rec1 = _node(nodes, model_dir, file_url)
    events = _serve(node1, rec1, "a", prompt)
    storage = _hashes(events, BlockStored, "STORAGE")
    gpu = _hashes(events, BlockStored, "GPU")
    assert len(storage) == PAGES and storage == gpu[:PAGES]
    assert set(storage) == _stored_pages(file_url)
    stored = [e for e in events if isinstance(e, BlockStored) and e.medium == "STORAGE"]
    assert stored[0].parent_block_hash is None
    assert [t for e in stored for t in e.token_ids] == prompt[: PAGES * BLOCK]
    assert {(e.block_size, e.locality, e.ownership, e.group_idx) for e in stored} == {
        (BLOCK, "LOCAL", "radixlink", 0)}
    assert not _hashes(events, BlockRemoved, "STORAGE")
    index = PrefixIndex(["n1", "n2"])
    index.apply(events, node_id="n1")
    assert index.store_prefix_pages(storage) == PAGES
    assert index.device_prefix_pages(storage) == [PAGES, 0]

    node2, rec2 = _node(nodes, model_dir, file_url)
    events2 = _serve(node2, rec2, "b", prompt)
    assert node2.workers[0].worker.stats["loaded_pages"] == PAGES
    assert _hashes(events2, BlockStored, "STORAGE") == storage
    assert _hashes(events2, BlockStored, "GPU")[:PAGES] == gpu[:PAGES]


def test_a_healed_bad_page_is_removed_then_stored_again(nodes, model_dir, file_url):
    """Flow: node 1 saves 12 pages; page 5 is corrupted; node 2's load finds it bad and
    deletes it: a STORAGE BlockRemoved of page 5's hash, then its recompute rewrites it: a
    STORAGE BlockStored of the same hash, after the removal. Pages 0-4 were verified by the
    load (announced once), 6-11 are rewritten (announced once each)."""
    prompt = _prompt(71, 200)
    node1, rec1 = _node(nodes, model_dir, file_url)
    storage = _hashes(_serve(node1, rec1, "a", prompt), BlockStored, "STORAGE")
    node2, rec2 = _node(nodes, model_dir, file_url)
    req = node2.add("b", prompt)
    _flip_payload_byte(file_url, node2.connector.scheduler_side.page_keys(req, PAGES)[5])
    node2.run()
    node2.step()
    events = rec2.take()
    assert node2.workers[0].worker.stats["bad_pages"] == 1
    assert _hashes(events, BlockRemoved, "STORAGE") == [storage[5]]
    kinds = [(type(e).__name__, hash_hex(h)) for e in events if e.medium == "STORAGE"
             for h in e.block_hashes]  # fmt: skip
    removed_at = kinds.index(("BlockRemoved", storage[5]))
    assert ("BlockStored", storage[5]) in kinds[removed_at + 1:]
    assert sorted(_hashes(events, BlockStored, "STORAGE")) == sorted(storage)
    assert set(storage) == _stored_pages(file_url)


def test_pages_found_present_are_announced(nodes, model_dir, file_url):
    """A node that does not load (``load: false``) computes the prompt and finds every page
    present when it saves (nothing written): it still announces the 12 pages, once each."""
    prompt = _prompt(72, 200)
    node1, rec1 = _node(nodes, model_dir, file_url)
    storage = _hashes(_serve(node1, rec1, "a", prompt), BlockStored, "STORAGE")
    node2, rec2 = _node(nodes, model_dir, file_url, extra={"load": False})
    events = _serve(node2, rec2, "b", prompt)
    assert node2.workers[0].worker.stats["skipped_pages"] == PAGES
    assert _hashes(events, BlockStored, "STORAGE") == storage


def test_tp2_announces_a_page_once_every_rank_holds_it(nodes, model_dir, file_url):
    """TP=2: both ranks' reports of a page reach the scheduler through vLLM's aggregator, and
    the page is announced once; a page only one rank reported is not announced until the
    other reports it too (its rank-1 part could be missing)."""
    prompt = _prompt(73, 200)
    node, rec = _node(nodes, model_dir, file_url, tp_size=2)
    storage = _hashes(_serve(node, rec, "a", prompt), BlockStored, "STORAGE")
    assert len(storage) == PAGES == len(set(storage))
    assert len(_stored_pages(file_url)) == PAGES  # one hash, two rank keys each
    other = _prompt(74, 40)
    req = node.add("c", other)
    events = node.connector.scheduler_side.events
    assert events is not None
    names = node.connector.scheduler_side.page_keys(req, 2)
    hashes = tuple(parse_key(k).page_hash for k in names)
    events.note(req, _job(req.request_id, hashes), 0, hashes)
    events.absorb(RadixlinkKVEvents([StoreReport(0, True, 0, hashes)]))
    assert events.take() == []
    events.absorb(RadixlinkKVEvents([StoreReport(1, True, 0, hashes)]))
    (event,) = [e for e in events.take() if isinstance(e, BlockStored)]  # NOTE: a sweep
    # may follow: these pages were reported, not written
    assert [hash_hex(h) for h in event.block_hashes] == [_as_event_hash(h) for h in hashes]
    assert event.token_ids == other[: 2 * BLOCK]


def _job(req_id: str, hashes: tuple[str, ...]) -> Any:
    from radixlink.integrations.vllm.metadata import GroupPages, PageJob

    return PageJob(req_id=req_id, groups=(GroupPages(group_id=0, block_ids=(1, 2),
                                                     hashes=hashes),))  # fmt: skip


def test_an_operator_clear_publishes_the_removal(nodes, model_dir, file_url, monkeypatch):
    """``radixlink store clear`` deletes the 12 pages a running node announced: its next sweep
    (every SWEEP_S, 0 here) finds its whole window gone, checks every announced page and
    publishes one STORAGE BlockRemoved of all 12; later sweeps publish nothing more."""
    monkeypatch.setattr(events_module, "SWEEP_S", 0.0)
    prompt = _prompt(75, 200)
    node, rec = _node(nodes, model_dir, file_url)
    storage = _hashes(_serve(node, rec, "a", prompt), BlockStored, "STORAGE")
    node.step()
    assert not _hashes(rec.take(), BlockRemoved, "STORAGE")  # every page is still there
    assert store_cli(["clear", file_url, "--all", "--yes"]) == 0
    node.step()
    assert sorted(_hashes(rec.take(), BlockRemoved, "STORAGE")) == sorted(storage)
    node.step()
    assert not rec.take()


def test_sweeps_find_pages_the_store_lost(nodes, model_dir, file_url, monkeypatch):
    """Pages the store lost on its own (here deleted behind the connector's back, as its LRU
    or a TTL would) are published removed by the sweeps, a window of SWEEP_PAGES (4 here)
    at a time, the longest-unchecked first; pages still there stay announced."""
    monkeypatch.setattr(events_module, "SWEEP_S", 0.0)
    monkeypatch.setattr(events_module, "SWEEP_PAGES", 4)
    prompt = _prompt(78, 200)
    node, rec = _node(nodes, model_dir, file_url)
    storage = _hashes(_serve(node, rec, "a", prompt), BlockStored, "STORAGE")
    keys = node.connector.scheduler_side.page_keys(node.add("x", prompt), PAGES)
    with open_store(file_url) as store:
        assert store.delete([keys[1], keys[6], keys[10]]) == 3
    removed: list[str] = []
    for _ in range(3):  # three windows of 4 cover the 12 announced pages
        node.step()
        removed += _hashes(rec.take(), BlockRemoved, "STORAGE")
    assert sorted(removed) == sorted(storage[i] for i in (1, 6, 10))
    node.step()
    assert not _hashes(rec.take(), BlockRemoved, "STORAGE")


def test_event_building_never_raises_into_vllm(nodes, model_dir, file_url, caplog):
    """Garbage reports and a request vLLM could not have made are logged and dropped: the
    connector's event entries return normally."""
    node, _ = _node(nodes, model_dir, file_url)
    events = node.connector.scheduler_side.events
    with caplog.at_level(logging.ERROR, logger=events_module.__name__):
        events.absorb(RadixlinkKVEvents([object()]))  # type: ignore[list-item]
        events.note(object(), _job("x", ("ab",)), 0, ("ab",))
        assert node.connector.take_events() == []
    assert [r.name for r in caplog.records if r.levelno >= logging.ERROR] == [
        events_module.__name__] * 2


def test_no_events_config_no_reports(nodes, model_dir, file_url):
    """Without vLLM's KV events the workers keep no reports and the connector yields none."""
    node = nodes(model_dir, file_url)
    node.add("a", _prompt(76, 100))
    node.run()
    assert node.workers[0].worker.reports is None
    assert node.workers[0].get_kv_connector_kv_cache_events() is None
    assert list(node.connector.take_events()) == []


@pytest.mark.parametrize(("url", "locality"), [
    ("file:///srv/kv", "LOCAL"), ("memory://?capacity=1GiB", "LOCAL"),
    ("redis://cache:6379/0", "REMOTE"), ("redis+cluster://cache:7000", "REMOTE"),
    ("tiered://?front=memory%3A%2F%2F&back=redis%3A%2F%2Fcache%3A6379%2F0", "REMOTE"),
    ("faults://?inner=file%3A%2F%2F%2Fsrv%2Fkv&delay_ms=1", "LOCAL"),
])  # fmt: skip
def test_locality_follows_the_store_behind_wrappers(url, locality):
    """vLLM's locality: network stores REMOTE, a directory or memory LOCAL; tiered:// and
    faults:// answer for the store behind them."""
    assert events_module.store_locality(url) == locality


def test_hybrid_groups_count_their_own_ranks(nodes, model_dir, file_url):
    """A hybrid (full + sliding-window) node at TP=2: a page's full-attention part is announced
    only once both ranks reported it, whatever the sliding-window group's reports say."""
    node, _ = _node(nodes, model_dir, file_url, hybrid=True, tp_size=2)
    events = node.connector.scheduler_side.events
    req = node.add("h", _prompt(77, 40))
    keys = node.connector.scheduler_side.page_keys(req, 2)[:2]  # group 0's two pages
    names = tuple(parse_key(k).page_hash for k in keys)
    hashes = [_as_event_hash(h) for h in names]
    from radixlink.integrations.vllm.metadata import GroupPages, PageJob

    job = PageJob(req_id="h", groups=tuple(GroupPages(group_id=g, block_ids=(1, 2), hashes=names)
                                           for g in (0, 1)))  # fmt: skip
    events.note(req, job, 0, names)
    events.absorb(RadixlinkKVEvents([StoreReport(0, True, 0, names),
                                     StoreReport(1, True, 1, names)]))
    assert events.take() == []  # each group has one rank of two
    events.absorb(RadixlinkKVEvents([StoreReport(1, True, 0, names)]))
    (event,) = [e for e in events.take() if isinstance(e, BlockStored)]  # NOTE: a sweep
    # may follow: these pages were reported, not written
    assert event.group_idx == 0
    assert [hash_hex(h) for h in event.block_hashes] == hashes
