"""The linker's data path on a CUDA device (opt-in: -m gpu): pool gathers into pinned staging
frames and scatters from them, an offload and a layer-wise load round trip byte-identical,
with per-layer events the current stream waits on."""

from __future__ import annotations

import pytest
import torch

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.contract import InsertParams, PoolName
from radixlink.linker.core import ExternalCacheLinker
from radixlink.memory import KVLayout, KVPool
from radixlink.pages.staging import StagingArena, frames_bytes, layout_frames
from radixlink.stores.codec import HEADER_BYTES
from radixlink.stores.memory import MemoryStore

pytestmark = pytest.mark.gpu
PS = 16
LAYOUT = KVLayout(num_layers=4, num_kv_heads=2, head_dim=64, dtype=torch.float16, page_size=PS)


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def _random(pool: KVPool) -> None:
    raw = pool.storage.view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, device=raw.device))


def test_cuda_pool_gathers_into_pinned_frames_and_scatters_back() -> None:
    """gather into pinned, spaced staging frames (one device-to-host copy) equals read_pages;
    scatter from them, whole or layer by layer, writes the same pages back."""
    pool = KVPool(LAYOUT, 32 * PS, device="cuda")
    _random(pool)
    size = (5, LAYOUT.page_bytes, HEADER_BYTES + LAYOUT.page_bytes)
    buffer, view = StagingArena(pinned=True).acquire(frames_bytes([size]))
    frames = layout_frames(buffer, view, [size])[0]
    pages = torch.tensor([3, 9, 1, 20, 7], device="cuda")
    pool.gather(pages, frames.payloads())
    torch.cuda.current_stream().synchronize()
    slots = (pages[:, None] * PS + torch.arange(PS, device="cuda")).reshape(-1)
    assert buffer.is_pinned() and torch.equal(frames.payloads(), pool.read_pages(slots))
    other = KVPool(LAYOUT, 32 * PS, device="cuda")
    targets = torch.tensor([2, 4, 6, 8, 10], device="cuda")
    staged = other.stage(frames.payloads())
    for layer in range(LAYOUT.num_layers):
        other.scatter(targets, staged, layer)
    torch.cuda.current_stream().synchronize()
    back = (targets[:, None] * PS + torch.arange(PS, device="cuda")).reshape(-1)
    assert torch.equal(other.read_pages(back), frames.payloads())


def test_cuda_offload_then_layerwise_load_round_trips() -> None:
    """A CUDA cache offloads a prefix (side-stream gather + event); another CUDA cache loads
    it with per-layer waits (events on the load's stream) and gets the same bytes."""
    def cache() -> UnifiedCache:
        return UnifiedCache(CacheConfig(page_size=PS, num_tokens=64 * PS, kv_layout=LAYOUT,
                                        enable_external_cache_linker=True, device="cuda"))

    store = MemoryStore(256 << 20)
    a = cache()
    linker_a = ExternalCacheLinker(a, store)
    tokens = list(range(10, 10 + 20 * PS))
    slots = a.alloc(len(tokens))
    _random(a.pool(PoolName.KV))
    a.insert(InsertParams(key=tokens, value=slots))
    linker_a.flush()
    expected = a.pool(PoolName.KV).read_pages(slots)
    b = cache()
    linker_b = ExternalCacheLinker(b, store)
    m = b.match_prefix(tokens, req_id="r")
    assert m.external_hit_len == len(tokens) and linker_b.load("r")
    landing = linker_b.landing("r")
    assert landing is not None
    assert all(landing.wait_layer(PoolName.KV, i, timeout=30)
               for i in range(LAYOUT.num_layers))
    out = linker_b.wait_load("r")
    assert out.ok and torch.equal(b.pool(PoolName.KV).read_pages(out.device_indices), expected)
    b.unlock(out.lock)
    linker_b.close()
    linker_a.close()
