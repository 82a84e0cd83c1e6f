"""The real-engine demos' report (``integrations/replay.py``): the store's share of the prompt
tokens is printed next to the follow-up TTFT ratio, and a differing output fails the run."""

from __future__ import annotations

import pytest

from radixlink.integrations.replay import Turn, report


def _turn(node: int, store: int, device: int, computed: int, ttft_s: float,
          out: list[int]) -> Turn:  # fmt: skip
    return Turn(node=node, prompt_ids=[1] * (store + device + computed), output_ids=out,
                ttft_s=ttft_s, tokens={"store": store, "device": device, "computed": computed})


def test_report_prints_the_store_share_and_the_follow_up_ratio(
        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Two turns, one a follow-up with 1,200 of 1,300 tokens from another node's pages."""
    on = {(0, 0): _turn(0, 0, 0, 1200, 2.0, [5, 6]), (0, 1): _turn(1, 1200, 0, 100, 0.5, [7])}
    off = {(0, 0): _turn(0, 0, 0, 1200, 2.0, [5, 6]), (0, 1): _turn(0, 0, 0, 1300, 2.5, [7])}
    assert report(on, off, 2) == 0
    out = capsys.readouterr().out
    assert "1 requests, median TTFT cache off 2.500 s / cache on 0.500 s = 5.0x lower" in out
    assert "prompt tokens, cache on: store 1200 (48%), device 0 (0%), computed 1300 (52%); " \
        "in those follow-up turns: store 1200 (92%), device 0 (0%), computed 100 (8%)" in out
    assert out.rstrip().endswith("outputs identical to cache-off run: 2/2 requests")


def test_report_fails_when_an_output_differs(capsys: pytest.CaptureFixture[str]) -> None:
    on = {(0, 0): _turn(0, 0, 0, 10, 1.0, [5, 6])}
    off = {(0, 0): _turn(0, 0, 0, 10, 1.0, [5, 7])}
    assert report(on, off, 1) == 1
    assert "outputs identical to cache-off run: 0/1 requests" in capsys.readouterr().out
