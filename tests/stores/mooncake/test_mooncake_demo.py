"""``radixlink demo --store mooncake://...``: engine node processes share pages through a real
Mooncake cluster, and every generated token equals the cache-off run."""

from __future__ import annotations

import pytest

from radixlink.engine.demo import main


def test_demo_over_mooncake_prints_identical_outputs(mooncake_url: str,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    """A short demo (tiny-hybrid, 2 conversations x 2 turns; the full one is in the issue's
    note): both nodes open the mooncake:// URL, later turns load pages the other node wrote,
    and the outputs are identical to the cache-off run."""
    code = main(["--model", "tiny-hybrid", "--conversations", "2", "--turns", "2",
                 "--max-new-tokens", "3", "--context-tokens", "120", "--store", mooncake_url])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "node 0" in out and "node 1" in out
    assert out.rstrip().splitlines()[-1] == "outputs identical to cache-off run: 4/4 requests"
