"""``radixlink store stats|ls|gc|clear``: counts by namespace, gc to capacity, clear needs --yes."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixlink.stores.admin import main
from radixlink.stores.directory import DirectoryStore

from .conformance import key


def _fill(root: Path) -> None:
    store = DirectoryStore(root)
    store.put({key(i, "aaaa"): b"x" * 1000 for i in range(3)})
    store.put({key(i, "bbbb"): b"x" * 500 for i in range(2)} | {"foreign": b"?"})


def test_stats_and_ls_report_pages_by_namespace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """stats prints one row per namespace (foreign keys apart); ls lists keys with sizes."""
    _fill(tmp_path)
    assert main(["stats", f"file://{tmp_path}"]) == 0
    rows = {
        line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines() if line
    }
    assert rows["aaaa"][0] == "3" and rows["bbbb"][0] == "2" and rows["total"][0] == "6"
    assert main(["ls", f"file://{tmp_path}", "--namespace", "bbbb"]) == 0
    listed = capsys.readouterr().out.split("\n")
    assert sorted(line.split()[1] for line in listed if line) == [key(0, "bbbb"), key(1, "bbbb")]


def test_gc_enforces_the_url_capacity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """gc with a smaller capacity in the URL deletes least recently used pages down to it."""
    _fill(tmp_path)
    assert main(["gc", f"file://{tmp_path}?capacity=2000"]) == 0
    assert capsys.readouterr().out.startswith("removed ")
    assert DirectoryStore(tmp_path, capacity_bytes=1 << 30).stats()["bytes"] <= 2000


def test_clear_requires_yes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """clear without --yes deletes nothing and exits 2; with --yes it deletes the namespace."""
    _fill(tmp_path)
    assert main(["clear", f"file://{tmp_path}", "--namespace", "aaaa"]) == 2
    assert "would delete 3 pages" in capsys.readouterr().err
    assert main(["clear", f"file://{tmp_path}", "--namespace", "aaaa", "--yes"]) == 0
    assert DirectoryStore(tmp_path).stats()["pages"] == 3
