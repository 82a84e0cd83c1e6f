"""Operator commands never destroy by accident and fail in one line: ``store clear`` needs an
explicit namespace or --all, ``store ls|stats`` change nothing, user errors print one line and
exit 2 (--debug: the traceback), demo and bench arguments are range-checked, and the demo runs
at page sizes 4 and 8 (issue 14, item 7)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from redis_server import free_port

from radixlink.cli import main
from radixlink.contract import PoolName
from radixlink.stores import page_key
from radixlink.stores.directory import DirectoryStore


def _fill(root: Path) -> DirectoryStore:
    store = DirectoryStore(root)
    for ns in ("aaaa", "bbbb"):
        for i in range(5):
            assert store.put({page_key(ns, f"{i:064x}", PoolName.KV): b"x" * 1000}) == [True]
    return store


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], *words: str) -> str:
    """Run the CLI; it must exit 2 with exactly one line on stderr containing ``words``."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)
    return err


@pytest.mark.parametrize(
    "extra",
    [["--namespace", "", "--yes"], ["--yes"], ["--namespace", "aaaa", "--all", "--yes"]],
    ids=["empty-namespace", "no-namespace", "both"],
)
def test_clear_needs_one_explicit_namespace_or_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    """An empty --namespace (it used to mean "everything"), none at all, or --namespace with
    --all: one-line error, exit 2, every page still there."""
    _fill(tmp_path)
    _one_line_error(capsys, ["store", "clear", f"file://{tmp_path}", *extra], "--")
    assert DirectoryStore(tmp_path).stats()["pages"] == 10


def test_clear_all_and_clear_one_namespace(tmp_path: Path) -> None:
    """--namespace deletes that namespace only; --all deletes everything."""
    _fill(tmp_path)
    assert main(["store", "clear", f"file://{tmp_path}", "--namespace", "aaaa", "--yes"]) == 0
    assert DirectoryStore(tmp_path).stats()["pages"] == 5
    assert main(["store", "clear", f"file://{tmp_path}", "--all", "--yes"]) == 0
    assert DirectoryStore(tmp_path).stats()["pages"] == 0


@pytest.mark.parametrize("action", ["ls", "stats"])
def test_ls_and_stats_change_nothing(tmp_path: Path, action: str) -> None:
    """ls / stats with a capacity smaller than the store evict nothing (it used to evict 6 of
    10 pages on open), and a mistyped path is an error that creates no directory."""
    _fill(tmp_path / "store")
    assert main(["store", action, f"file://{tmp_path}/store?capacity=4000"]) == 0
    assert DirectoryStore(tmp_path / "store").stats()["pages"] == 10
    assert main(["store", action, f"file://{tmp_path}/typo"]) == 2
    assert not (tmp_path / "typo").exists()


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["demo", "--nodes", "0"], ["--nodes", ">= 1"]),
        (["demo", "--nodes", "-1"], ["--nodes", ">= 1"]),
        (["demo", "--page-size", "0"], ["--page-size"]),
        (["demo", "--conversations", "x"], ["--conversations", "'x'"]),
        (["bench", "tree", "--requests", "-1"], ["--requests", ">= 1"]),
        (["bench", "tree", "--page-size", "16,0"], ["--page-size"]),
        (["bench", "store", "--repeat", "0"], ["--repeat"]),
        (["bench", "store", "--page-sizes", "junk"], ["--page-sizes"]),
        (["store", "ls", "memory://?capcity=1GiB"], ["capcity", "did you mean"]),
        (["store", "ls", "file://localhost/tmp/x"], ["no host", "file:///tmp/x"]),
        (["store", "frobnicate", "memory://"], ["invalid choice"]),
    ],
)
def test_user_errors_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], words: list[str]
) -> None:
    """Out-of-range demo/bench arguments (they used to raise ZeroDivisionError/IndexError),
    bad store URLs and bad actions: one line naming the culprit, exit status 2."""
    _one_line_error(capsys, argv, *words)


def test_an_unreachable_redis_is_one_line_and_debug_shows_the_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`store stats` against a port nobody listens on: one line saying what failed and what to
    check (it used to be a 23-frame traceback); with --debug the exception propagates."""
    pytest.importorskip("redis")
    url = f"redis://127.0.0.1:{free_port()}/0"
    _one_line_error(capsys, ["store", "stats", url], "failed", "check that the store is up")
    from radixlink.errors import StoreError

    with pytest.raises(StoreError):
        main(["--debug", "store", "stats", url])


@pytest.mark.parametrize("page_size", [4, 8])
def test_demo_runs_at_small_page_sizes(
    capsys: pytest.CaptureFixture[str], page_size: int, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The demo's warm-up request used to need more slots than 4 pages of 4 or 8 tokens
    hold; now it runs at both, on a sealed store, with outputs identical to cache-off."""
    monkeypatch.setenv("RADIXLINK_DEMO_TEST_SECRET", "s" * 32)
    store = f"file://{tmp_path}/store?auth=env:RADIXLINK_DEMO_TEST_SECRET"
    code = main(["demo", "--model", "tiny-hybrid", "--conversations", "2", "--turns", "2",
                 "--max-new-tokens", "2", "--context-tokens", "60", "--threads", "1",
                 "--page-size", str(page_size), "--store", store])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.rstrip().splitlines()[-1] == "outputs identical to cache-off run: 4/4 requests"
    assert "does not move SWA/Mamba state yet" not in out
    assert os.listdir(tmp_path / "store")  # the nodes shared pages through the store
