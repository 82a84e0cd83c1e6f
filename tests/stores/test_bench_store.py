"""``radixlink bench store`` runs end to end on a tiny workload and writes its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixlink.bench.store import main


def test_bench_store_on_a_store_too_small_names_the_capacity_to_give() -> None:
    """A store that drops the pages of a round it was just given is a ValueError saying what
    capacity to give it (the CLI prints it as one line), not an AssertionError traceback."""
    argv = ["--store", "memory://?capacity=1KiB", "--total", "1MiB", "--repeat", "1"]
    with pytest.raises(ValueError, match="capacity of at least twice --total"):
        main([*argv, "--page-sizes", "64KiB"])


def test_bench_store_smoke(tmp_path: Path, capsys: object) -> None:
    """Two page sizes x (store alone, with the codec) x put/get rows, each with store, raw and
    ratio figures; and per page size the codec with checksum only, key digest, and sealed with
    keyed BLAKE3 and with HMAC-SHA256, measured side by side, each seal also against the key
    digest."""
    out = tmp_path / "store.json"
    argv = ["--store", "memory://?capacity=64MiB", "--total", "1MiB", "--repeat", "1"]
    assert main([*argv, "--page-sizes", "64KiB,256KiB", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(row["page"], row["op"]) for row in rows] == [
        (page, op) for page in ("64 KiB", "256 KiB")
        for op in ("put", "get", "encode+put", "get+decode")
    ]
    assert all(row["store GB/s"] > 0 and row["raw GB/s"] > 0 for row in rows)
    codec_rows = json.loads(out.read_text())["codec_rows"]
    assert [(row["page"], row["format"]) for row in codec_rows] == [
        (page, fmt) for page in ("64 KiB", "256 KiB")
        for fmt in ("checksum", "key digest", "sealed blake3", "sealed hmac-sha256")
    ]
    assert all(row["encode MB/s"] > 0 and row["decode MB/s"] > 0 for row in codec_rows)
    assert all(row["encode vs key digest"] > 0 and row["decode vs key digest"] > 0
               for row in codec_rows)


def test_bench_store_file_rows_compare_with_checked_raw_baselines(tmp_path: Path) -> None:
    """A file store's put and get rows each come twice: against the plain raw write / read
    and against the raw forms with the store's guarantees (temp + rename; nofollow open +
    fstat + readv); the raw files are gone afterwards."""
    out = tmp_path / "store.json"
    root = tmp_path / "pages"
    argv = ["--store", f"file://{root}?capacity=64MiB", "--total", "256KiB", "--repeat", "1",
            "--page-sizes", "64KiB", "--json", str(out)]
    assert main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    baselines = [(row["op"], row["raw baseline"]) for row in rows]
    assert baselines == [
        ("put", "open + write / readv"), ("put", "temp + write + rename"),
        ("get", "open + write / readv"), ("get", "nofollow open + fstat + readv"),
        ("encode+put", "open + write / readv"), ("encode+put", "temp + write + rename"),
        ("get+decode", "open + write / readv"), ("get+decode", "nofollow open + fstat + readv"),
    ]
    assert all(row["store GB/s"] > 0 and row["raw GB/s"] > 0 for row in rows)
    assert not (tmp_path / "pages.rawbench").exists()
