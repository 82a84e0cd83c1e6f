"""The stand-ins themselves (``standins/``): the pure-torch copies do what the kernels they
stand in for do, a raising stub records its call before it raises (so the suite's teardown
check can fail), and ``sitecustomize`` loads them into a fresh interpreter: transformers keeps
its no-torchvision paths, torchvision names raise when called, denormals are flushed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .conftest import CALLS_ENV, STANDINS


@pytest.fixture
def standins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The stand-ins importable here, raising stubs recording into a file of this test's."""
    monkeypatch.syspath_prepend(str(STANDINS))
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv(CALLS_ENV, str(calls))
    return calls


def test_assign_req_to_token_pool_copies_each_requests_new_slots(standins: Path) -> None:
    """Request i's slots ``out_cache_loc[o_i : o_i + n_i]`` land in its row at [start, end)."""
    from sgl_kernel import assign_req_to_token_pool_cpu

    table = torch.full((4, 32), -1, dtype=torch.int32)
    rows = torch.tensor([2, 0, 3])
    starts = torch.tensor([5, 0, 10])
    ends = torch.tensor([9, 3, 10])  # the third request brings no new token
    locs = torch.arange(100, 107, dtype=torch.int64)
    assign_req_to_token_pool_cpu(rows, table, starts, ends, locs, table.shape[1])
    assert table[2, 5:9].tolist() == [100, 101, 102, 103]
    assert table[0, 0:3].tolist() == [104, 105, 106]
    assert int((table != -1).sum()) == 7


def test_a_raising_stub_records_its_call_and_raises(standins: Path) -> None:
    """The record is what the suite's teardown check reads."""
    import sgl_kernel

    with pytest.raises(NotImplementedError, match="copy_all_layer_kv_cache_cpu"):
        sgl_kernel.copy_all_layer_kv_cache_cpu(None, None, None, None)
    assert standins.read_text().split()[1:] == ["sgl_kernel.copy_all_layer_kv_cache_cpu"]


def test_transfer_kv_direct_copies_rows_between_layer_pairs(standins: Path) -> None:
    """``dst[dst_indices] = src[src_indices]`` per layer pair; other rows stay."""
    from sglang_cpu_standins.transfer_kv import transfer_kv_direct

    gen = torch.Generator().manual_seed(0)
    src = [torch.randn(64, 2, 8, generator=gen) for _ in range(2)]
    dst = [torch.zeros(48, 2, 8) for _ in range(2)]
    src_idx = torch.arange(16, 32)
    dst_idx = torch.arange(0, 16) + 32
    transfer_kv_direct(src, dst, src_idx, dst_idx, page_size=16)
    for s, d in zip(src, dst, strict=True):
        assert torch.equal(d[32:48], s[16:32])
        assert not d[:32].any()


def test_sitecustomize_loads_the_standins_into_a_fresh_interpreter(tmp_path: Path) -> None:
    """transformers sees no torchvision; a torchvision name imports and raises when called
    (recorded); denormals flush to zero once torch is imported."""
    calls = tmp_path / "calls.txt"
    code = (
        "import torch, transformers.utils.import_utils as hf\n"
        "assert not hf.is_torchvision_available()\n"
        "assert torch.tensor([1e-40], dtype=torch.float32).item() == 0.0\n"
        "from torchvision.transforms import InterpolationMode\n"
        "mode = InterpolationMode.BICUBIC\n"
        "try:\n    mode()\nexcept NotImplementedError:\n    print('raised')\n")
    env = {"PYTHONPATH": str(STANDINS), CALLS_ENV: str(calls), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "raised"
    assert calls.read_text().split()[1:] == ["torchvision.transforms.InterpolationMode.BICUBIC"]


def test_an_engine_without_the_standins_stops_with_one_line_naming_the_fix(
        smollm2: str, tmp_path: Path) -> None:
    """The library never imports the stand-ins: without them on ``PYTHONPATH`` the engine
    process refuses before importing SGLang, and the error is one line saying what to do."""
    from radixlink.integrations.child import NodeError
    from radixlink.integrations.sglang.engines import EngineSpec, SGLangNode

    with pytest.raises(NodeError) as err:
        SGLangNode(EngineSpec(model=smollm2, env={"PYTHONPATH": ""}), tmp_path / "engine.log",
                   start_timeout_s=120)
    message = str(err.value)
    assert "\n" not in message
    assert "sgl_kernel is not importable" in message and "PYTHONPATH=" in message
