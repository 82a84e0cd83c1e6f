"""KV pools against staging frames: gathers into and scatters from spaced rows (encoded pages
laid out with their headers), per-layer scatters, and the small (numpy) and large (torch)
paths agreeing byte for byte."""

from __future__ import annotations

import threading

import pytest
import torch

from radixlink.memory import KVLayout, KVPool
from radixlink.memory.pools import _SMALL_BYTES
from radixlink.pages.staging import LEAD, StagingArena, frames_bytes, layout_frames
from radixlink.stores.codec import HEADER_BYTES


def _pool(num_layers: int = 3, head_dim: int = 8, page_size: int = 4,
          num_pages: int = 12) -> KVPool:
    layout = KVLayout(num_layers=num_layers, num_kv_heads=2, head_dim=head_dim,
                      dtype=torch.float16, page_size=page_size)
    pool = KVPool(layout, num_pages * page_size)
    raw = pool.storage.view(torch.uint8)
    gen = torch.Generator().manual_seed(num_layers * 100 + head_dim)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    return pool


def _frames(pool: KVPool, count: int) -> object:
    size = (count, pool.layout.page_bytes, HEADER_BYTES + pool.layout.page_bytes)
    buffer, view = StagingArena().acquire(frames_bytes([size]))
    return layout_frames(buffer, view, [size])[0]


def _slots_of(pages: list[int], page_size: int) -> torch.Tensor:
    return torch.tensor([p * page_size + i for p in pages for i in range(page_size)])


@pytest.mark.parametrize("head_dim", [8, 4096], ids=["small-numpy", "large-torch"])
def test_gather_into_staging_frames_equals_read_pages(head_dim: int) -> None:
    """gather fills the payload rows of frames (16-byte aligned, spaced by their headers)
    with exactly read_pages' bytes, and leaves the bytes between payloads alone."""
    pool = _pool(head_dim=head_dim)
    pages = [7, 2, 9]
    frames = _frames(pool, len(pages))
    assert (head_dim == 8) == (len(pages) * pool.layout.page_bytes <= _SMALL_BYTES)
    frames.buffer.fill_(0xAB)
    pool.gather(torch.tensor(pages), frames.payloads())
    expected = pool.read_pages(_slots_of(pages, pool.page_size))
    assert torch.equal(frames.payloads(), expected)
    assert frames.payloads().data_ptr() % 16 == 0
    head = frames.buffer[LEAD : LEAD + HEADER_BYTES]
    assert bool((head == 0xAB).all())


@pytest.mark.parametrize("head_dim", [8, 4096], ids=["small", "large"])
def test_scatter_from_frames_and_layer_by_layer(head_dim: int) -> None:
    """Scattering staged pages writes them where write_pages would; one layer at a time
    writes that layer's K and V rows only, and all layers together give the whole pages."""
    source = _pool(head_dim=head_dim)
    pages = [1, 5, 3]
    frames = _frames(source, len(pages))
    source.gather(torch.tensor(pages), frames.payloads())
    whole = _pool(num_layers=3, head_dim=head_dim)
    whole.scatter(torch.tensor([4, 6, 8]), frames.payloads())
    by_layer = _pool(num_layers=3, head_dim=head_dim)
    before = by_layer.storage.view(torch.uint8).clone()  # NOTE: bytes: random fp16 has NaNs
    by_layer.scatter(torch.tensor([4, 6, 8]), frames.payloads(), layer=1)
    changed = (by_layer.storage.view(torch.uint8) != before).reshape(2, 3, -1).any(dim=-1)
    assert changed[:, 1].all() and not changed[:, 0].any() and not changed[:, 2].any()
    for layer in (0, 2):
        by_layer.scatter(torch.tensor([4, 6, 8]), frames.payloads(), layer=layer)
    target = _slots_of([4, 6, 8], 4)
    assert torch.equal(whole.read_pages(target), source.read_pages(_slots_of(pages, 4)))
    assert torch.equal(by_layer.read_pages(target), whole.read_pages(target))


def test_stage_keeps_aligned_pages_and_fixes_unaligned_ones() -> None:
    """stage returns aligned pages on the pool's device as they are (no copy) and an aligned
    copy of pages at an odd address; write_pages accepts both."""
    pool = _pool()
    frames = _frames(pool, 2)
    assert pool.stage(frames.payloads()).data_ptr() == frames.payloads().data_ptr()
    odd = torch.zeros(2 * pool.layout.page_bytes + 1, dtype=torch.uint8)[1:]
    odd = odd.view(2, pool.layout.page_bytes)
    staged = pool.stage(odd)
    assert staged.data_ptr() % 16 == 0 and torch.equal(staged, odd)
    pool.write_pages(_slots_of([3, 4], 4), frames.payloads())


def test_out_with_overlapping_rows_is_refused() -> None:
    """read_pages refuses an ``out`` whose rows overlap (a stride below the page)."""
    pool = _pool()
    flat = torch.empty(4 * pool.layout.page_bytes, dtype=torch.uint8)
    out = flat.as_strided((2, pool.layout.page_bytes), (8, 1))
    with pytest.raises(ValueError, match="non-overlapping rows"):
        pool.read_pages(_slots_of([1, 2], 4), out=out)


def test_a_staging_buffer_first_taken_in_inference_mode_is_writable_on_another_thread() -> None:
    """vLLM runs its model (and the connector's save gather) under ``torch.inference_mode``; a
    buffer the arena allocated there and handed out again to an I/O thread must take in-place
    writes outside inference mode (an inference tensor refuses them: every such save failed)."""
    arena = StagingArena()
    with torch.inference_mode():
        buffer, view = arena.acquire(4096)
        buffer[:8].copy_(torch.arange(8, dtype=torch.uint8))  # the engine thread's gather
    arena.release(buffer, view)
    errors: list[BaseException] = []

    def io_thread() -> None:
        again, _ = arena.acquire(4096)
        assert again is buffer, "the arena should reuse the released buffer"
        try:
            again[:8].copy_(torch.zeros(8, dtype=torch.uint8))  # encode in place
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=io_thread)
    thread.start()
    thread.join()
    assert not errors, errors
    assert not buffer.is_inference()


def test_a_reservation_the_memory_cannot_hold_is_refused_with_nothing_held(
        caplog: pytest.LogCaptureFixture) -> None:
    """``reserve`` is a warm-up: where the buffers cannot be had (a 1 PiB one here, which the
    allocator refuses) it says so and holds nothing, rather than raising into the engine that
    registered (vLLM's ``register_kv_caches``); the buffers it did get go back."""
    from radixlink.pages import pageio
    from radixlink.pages.engine import TransferEngine
    from radixlink.stores.memory import MemoryStore

    arena = StagingArena(max_cached_bytes=8 << 20)
    assert not arena.reserve(1 << 50, 1)
    assert arena.stats()["staging_cached_bytes"] == 0
    assert arena.reserve(1 << 20, 2) and arena.stats()["staging_cached_bytes"] == 2 << 20
    engine = TransferEngine(MemoryStore(1 << 20), 1, arena)
    try:
        engine.reserve_stream([pageio.make_codec("fp", 1 << 50)])  # no machine holds a page
    finally:
        engine.close()
    assert "could not reserve" in caplog.text
    assert arena.stats()["staging_cached_bytes"] == 2 << 20
