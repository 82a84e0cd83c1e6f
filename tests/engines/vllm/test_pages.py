"""``PagedGroup.gather`` into a caller's staging buffer (the vLLM connector's saves): the same
pages as a fresh gather, written into that buffer, and a clear error for a wrong buffer."""

from __future__ import annotations

import pytest
import torch

from .conftest import VLLM_MISSING  # noqa: E402, I001

pytest.importorskip("vllm", reason=VLLM_MISSING)

from radixlink.integrations.vllm.pages import PagedGroup  # noqa: E402


def _group() -> PagedGroup:
    torch.manual_seed(0)
    shape = (12, 4, 2, 8)  # physical [block, token, head, content]; views are [B, H, N, C]
    return PagedGroup([torch.randn(shape).permute(0, 2, 1, 3) for _ in range(3)])


def test_gather_into_a_staging_buffer_equals_a_fresh_gather() -> None:
    group = _group()
    ids = [7, 2, 11]
    staging = torch.full((len(ids) * group.page_bytes,), 0xAB, dtype=torch.uint8)
    pages = group.gather(ids, staging)
    assert torch.equal(pages, group.gather(ids))
    assert pages.data_ptr() == staging.data_ptr()  # written in place, no new buffer
    group.scatter([0, 1, 3], pages)  # and the pages land where scatter puts them
    assert torch.equal(group.gather([0, 1, 3]), pages)


@pytest.mark.parametrize("bad", ["short", "dtype"])
def test_a_wrong_staging_buffer_is_a_value_error(bad: str) -> None:
    group = _group()
    n = 2 * group.page_bytes
    out = torch.empty(n - 1, dtype=torch.uint8) if bad == "short" else torch.empty(n // 4)
    with pytest.raises(ValueError, match="host uint8 tensor of"):
        group.gather([1, 2], out)


def test_scatter_lands_strided_rows_in_many_blocks() -> None:
    """Pages fetched once (rows of a staging buffer of encoded frames: a header before each
    payload) land in several blocks each, straight from those rows."""
    group = _group()
    src = group.gather([4, 9])
    frame = group.page_bytes + 56
    staging = torch.zeros(2 * frame, dtype=torch.uint8)
    rows = staging.as_strided((2, group.page_bytes), (frame, 1), 56)
    rows.copy_(src)
    group.scatter([0, 1, 2], rows, [1, 0, 1])
    assert torch.equal(group.gather([0, 1, 2]), src[[1, 0, 1]])
    with pytest.raises(ValueError, match="one row per block"):
        group.scatter([0, 1], rows, [0, 2])  # row 2 does not exist


@pytest.mark.parametrize("layout", ["block first", "K and V outside the blocks", "strided"])
def test_payload_views_are_where_a_page_lands(layout: str) -> None:
    """``payload_views`` (a load read straight into the blocks): a block's views, filled one
    after another with a page, put it where ``scatter`` does (``gather`` reads it back) and
    write no other block; with K and V outside the block dimension (each layer's block a run
    of a spaced tensor) as well. A layout whose blocks are not one run has no views; a block
    id out of range is a ValueError."""
    torch.manual_seed(1)
    if layout == "block first":
        group = _group()
    elif layout == "K and V outside the blocks":  # NOTE: [2, blocks, ...]: a layer is K or V
        group = PagedGroup([torch.randn(2, 12, 4, 2, 8)[k].permute(0, 2, 1, 3)
                            for k in range(2) for _ in range(2)])
    else:  # NOTE: [head, block, token, content]: a block's head rows are spaced
        group = PagedGroup([torch.randn(2, 12, 4, 8).permute(1, 0, 2, 3) for _ in range(2)])
        assert group.payload_views([1]) is None
        return
    before = group.gather(list(range(12)))
    pages = torch.randint(0, 256, (2, group.page_bytes), dtype=torch.uint8)
    views = group.payload_views([5, 2])
    assert views is not None and len(views) == 2
    for page, pieces in zip(pages, views, strict=True):
        assert len(pieces) == group.num_layers
        pos = 0
        for piece in pieces:
            piece[:] = page.numpy()[pos : pos + piece.nbytes]
            pos += piece.nbytes
        assert pos == group.page_bytes
    assert torch.equal(group.gather([5, 2]), pages)
    others = [b for b in range(12) if b not in (5, 2)]
    assert torch.equal(group.gather(others), before[others])
    with pytest.raises(ValueError, match="not all within"):
        group.payload_views([12])
