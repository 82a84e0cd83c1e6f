"""`radixlink demo --engine sglang` outside .venv-sglang-cpu: one line naming the fix, exit 2;
a store its engine processes cannot share is refused before anything starts."""

from __future__ import annotations

import importlib.util

import pytest

from radixlink.engine.demo import main


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None,
                    reason="SGLang is installed here: the demo would run")
def test_demo_engine_sglang_without_sglang_says_how_to_get_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 2 and one line on stderr pointing at `make demo-sglang`."""
    assert main(["--engine", "sglang"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "make demo-sglang" in err


def test_demo_engine_sglang_refuses_a_private_store() -> None:
    """memory:// lives in one process; each SGLang engine is a process of its own."""
    with pytest.raises(ValueError, match=r"one process's memory"):
        main(["--engine", "sglang", "--store", "memory://"])
