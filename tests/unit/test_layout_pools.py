"""Layouts (sizes, fingerprints, validation) and pools (views, byte-exact page/state I/O)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixlink.contract import PoolName
from radixlink.memory import KVLayout, KVPool, MambaStatePool, PagedAllocator, StateLayout


def _layout(**overrides: object) -> KVLayout:
    fields: dict[str, object] = dict(
        num_layers=3, num_kv_heads=2, head_dim=8, dtype=torch.float16, page_size=4
    )
    fields.update(overrides)
    return KVLayout(**fields)  # type: ignore[arg-type]


def _random_fill(pool: KVPool, seed: int = 0) -> None:
    raw = pool.storage.view(torch.uint8)
    gen = torch.Generator().manual_seed(seed)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))


def _random_bytes(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)


def _slots(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


# ---------------------------------------------------------------- layouts


def test_kv_layout_sizes() -> None:
    """token_bytes counts K and V over all layers; page_bytes is page_size of them."""
    layout = _layout()
    assert layout.token_bytes == 2 * 3 * 2 * 8 * 2
    assert layout.page_bytes == layout.token_bytes * 4


def test_kv_layout_fingerprint_is_a_fixed_string() -> None:
    """The fingerprint is a literal (hence stable across processes) naming every field."""
    layout = _layout(num_layers=4, head_dim=64, page_size=16)
    assert layout.fingerprint() == "kv1:kv:L4:H2:D64:float16:P16:R0"
    assert layout.fingerprint(PoolName.SWA) == "kv1:swa:L4:H2:D64:float16:P16:R0"
    assert _layout(dtype=torch.bfloat16, replicated=True).fingerprint().endswith(":bfloat16:P4:R1")


@pytest.mark.parametrize(
    "change",
    [
        {"num_layers": 4},
        {"num_kv_heads": 1},
        {"head_dim": 16},
        {"dtype": torch.bfloat16},
        {"page_size": 8},
        {"replicated": True},
    ],
)
def test_kv_fingerprint_changes_with_every_field(change: dict[str, object]) -> None:
    """Any field change gives a different fingerprint."""
    assert _layout(**change).fingerprint() != _layout().fingerprint()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"num_layers": 0}, "num_layers must be a positive int, got 0"),
        ({"num_kv_heads": -2}, "num_kv_heads must be a positive int, got -2"),
        ({"head_dim": 8.0}, "head_dim must be a positive int, got 8.0"),
        ({"page_size": True}, "page_size must be a positive int, got True"),
        ({"dtype": "float16"}, "dtype must be a torch.dtype.*got 'float16'"),
        ({"replicated": 1}, "replicated must be a bool, got 1"),
    ],
)
def test_kv_layout_validation(change: dict[str, object], match: str) -> None:
    """Bad fields raise ValueError naming the field and value."""
    with pytest.raises(ValueError, match=match):
        _layout(**change)


def test_kv_layout_is_frozen_and_hashable() -> None:
    """Layouts are immutable values usable as dict keys."""
    layout = _layout()
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.page_size = 8  # type: ignore[misc]
    assert {layout: 1}[_layout()] == 1


def test_state_layout_sizes_and_fingerprint() -> None:
    """state_bytes sums every tensor; lists become tuples; the fingerprint is a literal."""
    layout = StateLayout(shapes=[[2, 4, 8], (2, 16, 32)], dtype=torch.float32)
    assert layout.shapes == ((2, 4, 8), (2, 16, 32))
    assert layout.tensor_bytes == (2 * 4 * 8 * 4, 2 * 16 * 32 * 4)
    assert layout.state_bytes == sum(layout.tensor_bytes)
    assert layout.fingerprint() == "state1:mamba:float32:S2x4x8,2x16x32"
    assert hash(layout) == hash(StateLayout(shapes=((2, 4, 8), (2, 16, 32)), dtype=torch.float32))


@pytest.mark.parametrize(
    ("shapes", "dtype", "match"),
    [
        ((), torch.float32, "non-empty sequence of shapes"),
        (((),), torch.float32, r"shapes\[0\] must be a non-empty tuple"),
        (((2, 0),), torch.float32, r"shapes\[0\] dim must be a positive int, got 0"),
        (((2,), (3, -1)), torch.float32, r"shapes\[1\] dim must be a positive int, got -1"),
        (((2,),), float, "dtype must be a torch.dtype"),
    ],
)
def test_state_layout_validation(shapes: object, dtype: object, match: str) -> None:
    """Empty or non-positive shapes and non-torch dtypes raise ValueError."""
    with pytest.raises(ValueError, match=match):
        StateLayout(shapes=shapes, dtype=dtype)  # type: ignore[arg-type]


# ---------------------------------------------------------------- KVPool


def test_kv_pool_views_share_storage() -> None:
    """k(layer)/v(layer) are [num_slots, heads, dim] views of one storage tensor."""
    pool = KVPool(_layout(), 16)
    assert pool.storage.shape == (2, 3, 16, 2, 8)
    assert pool.k(1).shape == (16, 2, 8) and pool.v(2).shape == (16, 2, 8)
    pool.k(1)[5] = 1.0
    pool.v(2)[6] = 2.0
    assert bool((pool.storage[0, 1, 5] == 1).all()) and bool((pool.storage[1, 2, 6] == 2).all())
    with pytest.raises(ValueError, match=r"layer must be in 0..2, got 3"):
        pool.k(3)
    with pytest.raises(ValueError, match=r"got -1"):
        pool.v(-1)


def test_read_pages_is_page_major() -> None:
    """Row i of read_pages is page i: K of every layer, then V of every layer."""
    pool = KVPool(_layout(), 20)
    _random_fill(pool)
    slots = _slots(12, 13, 14, 15, 4, 5, 6, 7)
    buf = pool.read_pages(slots)
    assert buf.dtype == torch.uint8 and buf.device.type == "cpu"
    assert buf.shape == (2, pool.layout.page_bytes)
    for i, page_slots in enumerate((slots[:4], slots[4:])):
        parts = [pool.k(layer)[page_slots] for layer in range(3)]
        parts += [pool.v(layer)[page_slots] for layer in range(3)]
        expected = torch.cat([p.reshape(-1).view(torch.uint8) for p in parts])
        assert torch.equal(buf[i], expected)


@pytest.mark.parametrize(
    "layout",
    [
        _layout(),
        _layout(dtype=torch.bfloat16, page_size=1),
        _layout(dtype=torch.float32, page_size=16, num_layers=1),
        _layout(dtype=torch.int8, head_dim=3, num_kv_heads=1, page_size=1),  # 3-byte rows
        _layout(dtype=torch.float64, head_dim=1, num_kv_heads=1, page_size=1),  # 8-byte rows
    ],
)
def test_write_then_read_is_byte_identical(layout: KVLayout) -> None:
    """Random bytes (NaN patterns included) survive write_pages -> read_pages exactly."""
    alloc = PagedAllocator(8 * layout.page_size, layout.page_size)
    pool = KVPool(layout, alloc.num_slots)
    slots = alloc.alloc(5 * layout.page_size)
    assert slots is not None
    buf = _random_bytes((5, layout.page_bytes), seed=1)
    pool.write_pages(slots, buf)
    assert torch.equal(pool.read_pages(slots), buf)
    other = alloc.alloc(2 * layout.page_size)  # untouched pages stay zero
    assert other is not None and not bool(pool.read_pages(other).any())


def test_read_pages_into_out_and_odd_buffers() -> None:
    """read_pages fills `out`; write_pages takes strided and unaligned host buffers."""
    layout = _layout()
    pool = KVPool(layout, 40)
    slots = torch.arange(8, 20, dtype=torch.int64)
    big = _random_bytes((3 * layout.page_bytes * 2 + 1,), seed=2)
    unaligned = big[1 : 1 + 3 * layout.page_bytes].view(3, layout.page_bytes)
    pool.write_pages(slots, unaligned)
    out = torch.empty(3, layout.page_bytes, dtype=torch.uint8)
    assert pool.read_pages(slots, out=out) is out and torch.equal(out, unaligned)
    strided = big[: 6 * layout.page_bytes].view(6, layout.page_bytes)[::2]
    assert not strided.is_contiguous()
    pool.write_pages(slots, strided)
    assert torch.equal(pool.read_pages(slots), strided)


def test_unaligned_out_is_filled() -> None:
    """read_pages fills an `out` whose address cannot hold wide rows (byte offset 1)."""
    layout = _layout()
    pool = KVPool(layout, 40)
    slots = torch.arange(8, 16, dtype=torch.int64)
    buf = _random_bytes((2, layout.page_bytes), seed=4)
    pool.write_pages(slots, buf)
    big = torch.zeros(2 * layout.page_bytes + 1, dtype=torch.uint8)
    out = big[1:].view(2, layout.page_bytes)
    assert pool.read_pages(slots, out=out) is out and torch.equal(out, buf)


def test_signaling_nan_bit_patterns_survive() -> None:
    """Signaling-NaN doubles and floats (bits a float move could quieten) round-trip."""
    layout = _layout(dtype=torch.float32, num_kv_heads=4)
    pool = KVPool(layout, 20)
    patterns = torch.tensor(
        [0x7FF0000000000001, 0x7FF4000000000000, -0x000FFFFFFFFFFFFF, 0x7F8000017F800001],
        dtype=torch.int64,
    )
    buf = patterns.repeat(4 * layout.page_bytes // 32).view(torch.uint8).view(4, -1)
    slots = torch.arange(4, 20, dtype=torch.int64)
    pool.write_pages(slots, buf)
    assert torch.equal(pool.read_pages(slots), buf)


def test_empty_slots_read_and_write_nothing() -> None:
    """Zero pages read as an empty [0, page_bytes] tensor and write as a no-op."""
    pool = KVPool(_layout(), 16)
    empty = torch.empty(0, dtype=torch.int64)
    buf = pool.read_pages(empty)
    assert buf.shape == (0, pool.layout.page_bytes)
    pool.write_pages(empty, buf)


@pytest.mark.parametrize(
    ("slots", "match"),
    [
        (_slots(0, 1, 2, 3), r"slots 0..3 fall outside pages 1..4.*page 0 is padding"),
        (_slots(20, 21, 22, 23), r"slots 20..23 fall outside pages 1..4"),
        (_slots(-4, -3, -2, -1), "fall outside pages"),
        (_slots(5, 6, 7, 8), "not page-aligned runs of page_size=4"),
        (_slots(4, 5, 7, 6), "not page-aligned"),
        (_slots(4, 5, 6), "3 slots is not a whole number of pages"),
        (torch.arange(4, 8, dtype=torch.int32), "int64 and 1-D, got torch.int32"),
        (torch.arange(4, 12).view(2, 4), r"shape \(2, 4\)"),
        ([4, 5, 6, 7], "int64 torch.Tensor, got list"),
    ],
)
def test_bad_slots_raise(slots: object, match: str) -> None:
    """read_pages and write_pages refuse malformed, padding or out-of-range slots."""
    pool = KVPool(_layout(), 20)
    with pytest.raises(ValueError, match=match):
        pool.read_pages(slots)  # type: ignore[arg-type]
    buf = torch.zeros(1, pool.layout.page_bytes, dtype=torch.uint8)
    with pytest.raises(ValueError, match=match):
        pool.write_pages(slots, buf)  # type: ignore[arg-type]


def test_bad_buffers_raise_and_write_nothing() -> None:
    """Wrong dtype/shape buffers and repeated pages raise before anything is written."""
    pool = KVPool(_layout(), 20)
    pb = pool.layout.page_bytes
    slots = _slots(4, 5, 6, 7)
    with pytest.raises(ValueError, match="buf must be uint8, got torch.float16"):
        pool.write_pages(slots, torch.ones(1, pb // 2, dtype=torch.float16))
    with pytest.raises(ValueError, match=rf"shape \(2, {pb}\), expected \(1, {pb}\)"):
        pool.write_pages(slots, torch.ones(2, pb, dtype=torch.uint8))
    with pytest.raises(ValueError, match="repeat a page"):
        pool.write_pages(torch.cat([slots, slots]), torch.ones(2, pb, dtype=torch.uint8))
    with pytest.raises(ValueError, match="out has shape"):
        pool.read_pages(slots, out=torch.empty(2, pb, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8 torch.Tensor, got bytes"):
        pool.write_pages(slots, b"\x00" * pb)  # type: ignore[arg-type]
    assert not bool(pool.storage.view(torch.uint8).any())


def test_kv_pool_constructor_validation() -> None:
    """num_slots must be a positive multiple of page_size; layout must be a KVLayout."""
    with pytest.raises(ValueError, match="num_slots=18 is not a multiple of page_size=4"):
        KVPool(_layout(), 18)
    with pytest.raises(ValueError, match="num_slots must be a positive int, got 0"):
        KVPool(_layout(), 0)
    with pytest.raises(ValueError, match="layout must be a KVLayout, got StateLayout"):
        KVPool(StateLayout(shapes=((1,),), dtype=torch.float32), 16)  # type: ignore[arg-type]


# ---------------------------------------------------------------- MambaStatePool


def _state_pool(num_states: int = 3) -> MambaStatePool:
    layout = StateLayout(shapes=((2, 3, 4), (2, 5)), dtype=torch.float32)
    return MambaStatePool(num_states, layout)


def test_state_alloc_until_none_never_slot_zero() -> None:
    """alloc hands out 1..num_states once each, then None; sizes track it."""
    pool = _state_pool(3)
    assert pool.total_size() == 3 and pool.available_size() == 3
    got = [pool.alloc() for _ in range(4)]
    assert sorted(s for s in got[:3] if s is not None) == [1, 2, 3] and got[3] is None
    assert pool.available_size() == 0 and pool.is_allocated(2) and not pool.is_allocated(0)
    pool.free(2)
    assert pool.available_size() == 1 and not pool.is_allocated(2) and pool.alloc() == 2


@pytest.mark.parametrize(
    ("slot", "match"),
    [
        (0, "cannot free state slot 0: valid 1..3"),
        (4, "cannot free state slot 4: valid 1..3"),
        (True, "state slot True"),
        ("1", "state slot '1'"),
        (2, "cannot free state slot 2: it is not allocated"),
    ],
)
def test_state_free_misuse_raises(slot: object, match: str) -> None:
    """Freeing padding, out-of-range, non-int or never-allocated slots raises ValueError."""
    pool = _state_pool(3)
    assert pool.alloc() == 1
    with pytest.raises(ValueError, match=match):
        pool.free(slot)  # type: ignore[arg-type]
    assert pool.available_size() == 2


def test_state_double_free_raises() -> None:
    """The second free of a slot raises and the free count stays right."""
    pool = _state_pool(2)
    slot = pool.alloc()
    assert slot is not None
    pool.free(slot)
    with pytest.raises(ValueError, match="not allocated"):
        pool.free(slot)
    assert pool.available_size() == 2


def test_state_tensors_copy_and_round_trip() -> None:
    """tensors(i) are model views; copy and write/read_state move exact bytes."""
    pool = _state_pool(3)
    assert pool.num_tensors == 2
    assert pool.tensors(0).shape == (4, 2, 3, 4) and pool.tensors(1).shape == (4, 2, 5)
    with pytest.raises(ValueError, match=r"must be in 0..1, got 2"):
        pool.tensors(2)
    src, dst = pool.alloc(), pool.alloc()
    assert src is not None and dst is not None
    buf = _random_bytes((pool.layout.state_bytes,), seed=3)
    pool.write_state(src, buf)
    assert torch.equal(pool.read_state(src), buf)
    expected0 = buf[: pool.layout.tensor_bytes[0]].view(torch.float32).view(2, 3, 4)
    assert torch.equal(pool.tensors(0)[src].view(torch.uint8), expected0.view(torch.uint8))
    pool.copy(src, dst)
    out = torch.empty(pool.layout.state_bytes, dtype=torch.uint8)
    assert pool.read_state(dst, out=out) is out and torch.equal(out, buf)


def test_state_io_misuse_raises() -> None:
    """State I/O on free slots or with a wrong buffer raises ValueError."""
    pool = _state_pool(3)
    slot = pool.alloc()
    assert slot is not None
    nbytes = pool.layout.state_bytes
    with pytest.raises(ValueError, match="cannot read state slot 2: it is not allocated"):
        pool.read_state(2)
    with pytest.raises(ValueError, match="cannot copy to state slot 3"):
        pool.copy(slot, 3)
    expected = rf"buf has shape \({nbytes - 1},\), expected \({nbytes},\)"
    with pytest.raises(ValueError, match=expected):
        pool.write_state(slot, torch.zeros(nbytes - 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="out must be uint8"):
        pool.read_state(slot, out=torch.zeros(nbytes, dtype=torch.int8))
    with pytest.raises(ValueError, match="num_states must be a positive int, got 0"):
        MambaStatePool(0, pool.layout)
