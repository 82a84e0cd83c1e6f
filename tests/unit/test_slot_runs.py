"""Where a load's pages land in SGLang's pools (``SlotRuns``): the runs of consecutive slots
and ``index_put_`` must place every row exactly where a row-by-row reference does, from spaced
staging frames, for device pools (per layer) and for the host pool's four layouts."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from radixlink.contract import PoolName
from radixlink.integrations.sglang import slot_runs
from radixlink.integrations.sglang.device_pools import PoolView
from radixlink.integrations.sglang.host_pages import _MHA_LAYOUTS, HostPages
from radixlink.integrations.sglang.slot_runs import SlotRuns
from radixlink.pages.staging import StagingArena, layout_frames

LAYERS, HEADS, DIM, PAGE = 3, 2, 8, 4


def _pages(kind: str, num_pages: int, pool_pages: int, gen: torch.Generator) -> list[int]:
    """Page ids: one run, three runs, or scattered (every other page, shuffled)."""
    if kind == "one run":
        return list(range(5, 5 + num_pages))
    if kind == "three runs":
        third = num_pages // 3
        return [*range(2, 2 + third), *range(20, 20 + third),
                *range(40, 40 + num_pages - 2 * third)]
    order = torch.randperm(pool_pages // 2, generator=gen)[:num_pages] * 2
    return order.tolist()


def _slots(pages: list[int], rows: int) -> torch.Tensor:
    return (torch.tensor(pages)[:, None] * rows + torch.arange(rows)).reshape(-1)


def _staged(data: torch.Tensor) -> torch.Tensor:
    """``data`` (uint8 [pages, bytes]) copied into spaced staging frames: the payload view
    the engine hands a landing."""
    buffer, view = StagingArena().acquire(8 << 20)
    (frames,) = layout_frames(buffer, view, [(data.shape[0], data.shape[1], data.shape[1] + 64)])
    frames.payloads().copy_(data)
    return frames.payloads()


@pytest.mark.parametrize("dense", [True, False])  # copy_runs in numpy / scatter in torch
@pytest.mark.parametrize("min_bytes", [0, 1 << 40])  # every run copied / always index_put_
@pytest.mark.parametrize("kind", ["one run", "three runs", "scattered"])
@pytest.mark.parametrize("rows", [1, PAGE])
def test_device_pool_layers_land_where_a_row_by_row_copy_puts_them(
        monkeypatch: pytest.MonkeyPatch, dense: bool, min_bytes: int, kind: str,
        rows: int) -> None:
    monkeypatch.setattr(slot_runs, "RUN_MIN_BYTES", min_bytes)
    monkeypatch.setattr(slot_runs, "COPY_RUN_MIN_BYTES", min_bytes)
    gen = torch.Generator().manual_seed(7)
    pool_rows = 64 * rows

    memory = [torch.zeros(pool_rows, HEADS, DIM * (1 if dense else 2), dtype=dtype)
              for dtype in (torch.float32, torch.float16) for _ in range(LAYERS)]
    k, v = [m[..., :DIM] for m in memory[:LAYERS]], [m[..., :DIM] for m in memory[LAYERS:]]
    assert (slot_runs.byte_rows(k[0]) is not None) == dense
    view = PoolView(PoolName.KV, {i: (k[i], v[i]) for i in range(LAYERS)}, rows_per_page=rows)
    pages = _pages(kind, 12, 64, gen)
    data = torch.randint(0, 256, (12, view.page_bytes), dtype=torch.uint8, generator=gen)
    slots = view.plan(_slots(pages, rows))
    assert (slots.runs is None) == (min_bytes > 0)
    for layer in range(LAYERS):
        view.write_layer(layer, slots, _staged(data))
    at = _slots(pages, rows)
    for layer in range(LAYERS):  # every row where plain indexing finds it
        row_bytes = HEADS * DIM * 4
        offset = layer * rows * row_bytes * 3 // 2  # a layer: K (fp32) then V (fp16) rows
        expected_k = data[:, offset : offset + rows * row_bytes].reshape(-1, row_bytes)
        assert torch.equal(k[layer][at].reshape(len(at), -1).view(torch.uint8), expected_k)
    assert torch.equal(view.read_pages(at), data)
    spaced = _staged(torch.zeros_like(data))  # an offload gathers into staging frames
    assert view.read_pages(at, out=spaced) is spaced and torch.equal(spaced, data)
    with pytest.raises(ValueError, match="out of shape"):
        view.read_pages(at, out=spaced[:-1])
    untouched = torch.ones(pool_rows, dtype=torch.bool)
    untouched[_slots(pages, rows)] = False
    assert all(int(m[untouched].count_nonzero()) == 0 for m in memory)


@pytest.mark.parametrize("kind", ["one run", "three runs", "scattered"])
@pytest.mark.parametrize("rows", [1, PAGE])
def test_payload_views_are_where_each_page_lands(kind: str, rows: int) -> None:
    """``payload_views`` (a load read straight into the pools): each page's views, filled
    one after another with its stored payload, put every row where ``write`` does and
    nothing anywhere else; read back through ``read_pages``. Rows that are not dense, or a
    page whose rows are not consecutive slots, have no views (the load goes through
    staging); a slot past the pool's end is a ValueError."""
    gen = torch.Generator().manual_seed(5)
    memory = [torch.zeros(64 * rows, HEADS, DIM, dtype=dtype)
              for dtype in (torch.float32, torch.float16) for _ in range(LAYERS)]
    view = PoolView(PoolName.KV, {i: (memory[i], memory[LAYERS + i]) for i in range(LAYERS)},
                    rows_per_page=rows)
    pages = _pages(kind, 12, 64, gen)
    data = torch.randint(0, 256, (12, view.page_bytes), dtype=torch.uint8, generator=gen)
    targets = view.payload_views(_slots(pages, rows))
    assert targets is not None and len(targets) == 12
    for page, views in zip(data, targets, strict=True):
        assert len(views) == 2 * LAYERS
        pos = 0
        for piece in views:
            piece[:] = page.numpy()[pos : pos + piece.nbytes]
            pos += piece.nbytes
        assert pos == view.page_bytes
    assert torch.equal(view.read_pages(_slots(pages, rows)), data)
    untouched = torch.ones(64 * rows, dtype=torch.bool)
    untouched[_slots(pages, rows)] = False
    assert all(int(m[untouched].count_nonzero()) == 0 for m in memory)
    spaced = [torch.zeros(64 * rows, HEADS, 2 * DIM)[..., :DIM] for _ in range(2)]
    assert PoolView(PoolName.KV, {0: tuple(spaced)}, rows_per_page=rows).payload_views(
        _slots(pages, rows)) is None
    if rows > 1:
        gappy = _slots(pages, rows).clone()
        gappy[1] += 1
        assert view.payload_views(gappy) is None
    with pytest.raises(ValueError, match="outside its"):
        view.payload_views(_slots([64], rows))


def test_runs_follow_the_slots_and_a_page_with_gaps_is_indexed() -> None:
    assert SlotRuns.plan(_slots([3, 4, 5, 9, 10], 4), 4, 1 << 20, torch.device("cpu")).runs \
        == ((0, 3, 12), (3, 2, 36))
    gappy = torch.tensor([0, 1, 2, 4, 8, 9, 10, 11])  # the first page's rows skip slot 3
    assert SlotRuns.plan(gappy, 4, 1 << 20, torch.device("cpu")).runs is None
    short = SlotRuns.plan(_slots([3, 4], 4), 4, 16, torch.device("cpu"))
    assert short.runs is None  # 128 bytes a run: index_put_ is faster
    with pytest.raises(ValueError, match="whole number of 4-slot pages"):
        SlotRuns.plan(torch.arange(6), 4, 16, torch.device("cpu"))


def _host_pool(layout: str, num_pages: int) -> SimpleNamespace:
    """An MHA host pool of ``layout`` as SGLang lays out its ``kv_buffer``."""
    indexed, names = _MHA_LAYOUTS[layout]
    sizes = {"kv": 2, "layer": LAYERS, "page": num_pages, "token": PAGE, "head": HEADS,
             "dim": DIM}
    shape = [sizes[n] for n in names]
    if indexed == "token":  # NOTE: page and token are one dim there
        at = names.index("page")
        shape[at : at + 2] = [num_pages * PAGE]
    return SimpleNamespace(kv_buffer=torch.zeros(shape), layout=layout, page_size=PAGE,
                           layer_num=LAYERS, head_num=HEADS, head_dim=DIM, dtype=torch.float32)


@pytest.mark.parametrize("min_bytes", [0, 1 << 40])
@pytest.mark.parametrize("kind", ["one run", "scattered"])
@pytest.mark.parametrize("layout", sorted(_MHA_LAYOUTS))
def test_host_pages_land_from_staging_frames_and_read_back(
        monkeypatch: pytest.MonkeyPatch, min_bytes: int, kind: str, layout: str) -> None:
    monkeypatch.setattr(slot_runs, "RUN_MIN_BYTES", min_bytes)
    gen = torch.Generator().manual_seed(11)
    pages = HostPages(_host_pool(layout, 64))
    ids = _pages(kind, 9, 64, gen)
    data = torch.randint(0, 256, (9, pages.page_bytes), dtype=torch.uint8, generator=gen)
    pages.write(_slots(ids, PAGE), _staged(data))
    assert torch.equal(pages.read(_slots(ids, PAGE)), data)
    assert int(pages.pool.kv_buffer.count_nonzero()) == int(
        data.view(torch.float32).count_nonzero())  # nothing written anywhere else


def test_both_load_lines_parse_in_bench_sglang(caplog: pytest.LogCaptureFixture) -> None:
    """``bench sglang`` reads the linker's per-batch lines: a staged batch (read and verify,
    then the landing) and a streamed one (landed while read: its copies count as landing,
    the rest as read and verify, adding up to its wall time; its thread's CPU time apart),
    and the forward's wait on a batch (``finish_layer_wise_loading``'s line)."""
    from radixlink.bench.sglang_engine import _loads
    from radixlink.integrations.sglang.workers import ChunkLanding, LayerLanding, PageMove, log_load
    from radixlink.pages import pageio
    from radixlink.pages.engine import Completion, TransferKind, TransferStatus

    view = PoolView(PoolName.KV, {0: (torch.zeros(8, HEADS, DIM),)}, rows_per_page=PAGE)
    move = PageMove(view=view, codec=pageio.make_codec("fp", view.page_bytes), keys=["a", "b"],
                    slots=torch.arange(8))
    streamed = ChunkLanding(1, [move], counter=None, num_layers=1)
    streamed.seconds += [0.25, 0.5]
    staged = LayerLanding(2, [move], [], counter=None, num_layers=1, sync=lambda: None)
    staged.land_s = 1.5
    caplog.set_level("INFO", logger="radixlink")
    for landing, seconds in ((streamed, 2.0), (staged, 4.0)):
        log_load(landing.index, [move], Completion(job_id=0, kind=TransferKind.LOAD,
                                                   status=TransferStatus.OK, num_bytes=1000,
                                                   seconds=seconds, cpu_seconds=seconds / 4),
                 landing)
    logging.getLogger("radixlink.integrations.sglang.linker").info(
        "radixlink load batch %d: the forward waited %.4f s on it", 1, 0.0125)
    assert _loads(caplog.text) == {"pages": 4, "bytes": 2000, "read_s": 1.25 + 2.5,
                                   "land_s": 0.75 + 1.5, "streamed": 1, "cpu_s": 0.5,
                                   "waited_s": 0.0125, "waits": 1}
