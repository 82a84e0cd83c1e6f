"""Operators and hostile input (issue 24, items 3, 7, 8, 10, 11): ``store clear`` deletes only
radixlink's pages, a FIFO as the secret file cannot block, CLI and demo errors are one line on
stderr from the parent process, and ``store ls|stats`` never print a key raw."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from radixlink.cli import main
from radixlink.contract import PoolName
from radixlink.stores import open_store, page_key
from radixlink.stores.directory import DirectoryStore
from radixlink.stores.registry import parse_size

PAGES = [page_key("aaaa", f"{i:064x}", PoolName.KV) for i in range(3)]
FOREIGN = ["session:alice", "app:config", "v2/not-a-page"]


def _cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m radixlink ARGV`` as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "radixlink", *argv], capture_output=True,
                          text=True, timeout=timeout, check=False)


def _in_process(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``radixlink ARGV`` in this process (faster than a subprocess): (status, out, err)."""
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _assert_one_line_error(run: subprocess.CompletedProcess[str], *words: str) -> None:
    lines = run.stderr.strip().splitlines()
    assert run.returncode != 0 and len(lines) == 1, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_clear_all_keeps_foreign_redis_keys(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Redis db shared with other software: ``clear --all --yes`` deletes the radixlink
    pages and leaves ``session:alice``, ``app:config`` and a look-alike key alone (it used to
    delete all of them)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        client.mset({key: b"page" for key in PAGES} | {key: b"theirs" for key in FOREIGN})
        code, _, err = _in_process(capsys, "store", "clear", redis_url, "--all")
        assert code == 2 and "would delete 3 pages" in err, err
        code, out, err = _in_process(capsys, "store", "clear", redis_url, "--all", "--yes")
        assert code == 0 and "deleted 3 pages" in out, err
        assert client.exists(*PAGES) == 0
        assert sorted(k.decode() for k in client.keys("*")) == sorted(FOREIGN)
    finally:
        client.close()


def test_clear_all_keeps_foreign_files_in_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Foreign files inside the store's shard directories survive ``clear --all``; every
    radixlink page goes."""
    store = DirectoryStore(tmp_path)
    store.put({key: b"page" for key in PAGES} | {key: b"theirs" for key in FOREIGN})
    paths = [store.path_of(key) for key in FOREIGN]
    code, out, err = _in_process(capsys, "store", "clear", f"file://{tmp_path}", "--all", "--yes")
    assert code == 0 and "deleted 3 pages" in out, err
    assert all(os.path.exists(path) for path in paths)
    assert DirectoryStore(tmp_path).exists(PAGES) == [False] * 3


def test_a_fifo_as_the_secret_file_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``auth=file:<a FIFO>`` with no writer: ``open_store`` refuses it in one line naming the
    file (it used to block forever in open()). A symlink and a too-large file are refused
    too; a regular file still works."""
    fifo, link, big = tmp_path / "fifo", tmp_path / "link", tmp_path / "big"
    os.mkfifo(fifo)
    big.write_bytes(b"k" * 5000)
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 32 + b"\n")
    link.symlink_to(secret)
    errors: list[str] = []

    def attempt() -> None:
        try:
            open_store(f"memory://?auth=file:{fifo}")
        except ValueError as exc:
            errors.append(str(exc))

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # NOTE: unblock the old code's open() so the test process can exit
        with open(fifo, "wb"):
            pass
        pytest.fail("open_store blocked on a FIFO secret file")
    assert errors and f"auth=file:{fifo}" in errors[0] and "regular file" in errors[0]
    for path, words in ((link, "symlink"), (big, "5000 bytes")):
        with pytest.raises(ValueError, match=words):
            open_store(f"memory://?auth=file:{path}")
    assert open_store(f"memory://?auth=file:{secret}").page_secret == b"s" * 32
    code, _, err = _in_process(capsys, "store", "stats", f"memory://?auth=file:{fifo}")
    assert code == 2 and len(err.strip().splitlines()) == 1 and f"auth=file:{fifo}" in err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["store", "stats", f"memory://?capacity={'9' * 400}"], ["capacity=", "8 EiB"]),
        (["demo", "--model", "tiny-hybrid", "--faults", "fail=2"], ["--faults", "fail=",
                                                                    "from 0 to 1"]),
        (["demo", "--model", "tiny-hybrid", "--faults", "delay_ms=-1"], ["--faults",
                                                                         "delay_ms=", "from 0"]),
        (["bench", "memory", "--mib", "-1"], ["--mib", ">= 1"]),
        (["bench", "hash", "--rounds", "0"], ["--rounds", ">= 1"]),
        (["bench", "e2e", "--nodes", "0"], ["--nodes", ">= 1"]),
        (["bench", "cluster", "--trace", "x", "--gemm-mfu", "0"], ["--gemm-mfu", "> 0"]),
    ],
    ids=["capacity-400-nines", "demo-fail-2", "demo-delay-negative", "bench-memory-mib",
         "bench-hash-rounds", "bench-e2e-nodes", "bench-cluster-mfu"],
)
def test_cli_errors_are_one_line_before_any_process_starts(argv: list[str],
                                                           words: list[str]) -> None:
    """Out-of-range sizes, fault knobs and bench numbers: one line on stderr naming the
    argument and its allowed range, non-zero exit (they used to be an OverflowError
    traceback, 42 lines with 3 node tracebacks, or a benchmark that ran)."""
    _assert_one_line_error(_cli(*argv), *words)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2.01KB", 2010), ("2.03GB", 2_030_000_000), ("0.5KiB", 512), ("2GiB", 2 << 30)],
)
def test_parse_size_is_exact(text: str, expected: int) -> None:
    """Sizes are exact decimal arithmetic, not float (2.01KB is 2010 bytes; through a float
    it was 2009)."""
    assert parse_size(text) == expected


@pytest.mark.parametrize("action", ["ls", "stats"])
def test_ls_and_stats_escape_non_printable_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], action: str
) -> None:
    """A key carrying an escape sequence and a newline reaches the terminal escaped
    (``\\x1b``, ``\\x0a``), never raw."""
    hostile = page_key("aa\x1b[2Jbb\nok", "0" * 64, PoolName.KV)
    DirectoryStore(tmp_path).put({hostile: b"x", "evil\x07\x1b]0;title\x07": b"y"})
    code, out, err = _in_process(capsys, "store", action, f"file://{tmp_path}")
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b[2Jbb\\x0aok" in out
