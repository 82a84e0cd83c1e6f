"""`radixlink bench hash`: page_hashes throughput next to raw hashlib.sha256 in the same run.

Owns only this benchmark; measures radixlink.hashing through its public API.
"""

from __future__ import annotations

import hashlib
import json
import platform
import ssl
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from radixlink.cmdargs import CommandParser, int_at_least
from radixlink.hashing import page_hashes

TARGET_RATIO = 0.8


def _raw_sha256(pages: list[bytes]) -> Callable[[], object]:
    sha256 = hashlib.sha256

    def run() -> object:
        for page in pages:
            sha256(page).digest()
        return None

    return run


def _raw_sha256_hex(pages: list[bytes]) -> Callable[[], object]:
    sha256 = hashlib.sha256
    return lambda: [sha256(page).hexdigest() for page in pages]


def _ours(tokens: Any, page_size: int, algo: str) -> Callable[[], object]:
    return lambda: page_hashes(tokens, page_size, algo=algo)


def _has_xxhash() -> bool:
    try:
        import xxhash  # noqa: F401
    except ImportError:
        return False
    return True


def _best_times(cases: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Interleave the cases round by round (so load spikes hit all alike); keep each best."""
    for run in cases.values():  # warm-up
        run()
    best = {name: float("inf") for name in cases}
    for _ in range(rounds):
        for name, run in cases.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def _measure(num_tokens: int, page_size: int, rounds: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    array = rng.integers(0, 200_000, size=num_tokens, dtype=np.int64)
    as_list = array.tolist()
    step = 4 * page_size
    data = array.astype("<u4").tobytes()
    num_pages = num_tokens // page_size
    pages = [data[i * step : (i + 1) * step] for i in range(num_pages)]
    # Sanity: with no namespace, page 0 is plain sha256 of its bytes.
    assert page_hashes(array, page_size)[0] == hashlib.sha256(pages[0]).hexdigest()
    cases: dict[str, Callable[[], object]] = {
        "hashlib.sha256 raw|bytes": _raw_sha256(pages),
        "hashlib.sha256 raw hex|bytes": _raw_sha256_hex(pages),
        "page_hashes sha256|numpy": _ours(array, page_size, "sha256"),
        "page_hashes sha256|list": _ours(as_list, page_size, "sha256"),
    }
    if _has_xxhash():
        cases["page_hashes xxh3|numpy"] = _ours(array, page_size, "xxh3")
    best = _best_times(cases, rounds)
    raw = best["hashlib.sha256 raw|bytes"]
    rows = []
    for name, seconds in best.items():
        impl, kind = name.split("|")
        rows.append(
            {
                "page_size": page_size,
                "impl": impl,
                "input": kind,
                "pages_per_s": num_pages / seconds,
                "us_per_page": seconds / num_pages * 1e6,
                "ratio_vs_raw_sha256": raw / seconds,
            }
        )
    return rows


def _print_table(rows: list[dict[str, Any]]) -> None:
    header = f"{'page':>5}  {'impl':<26} {'input':<6} {'pages/s':>12} {'us/page':>8} {'vs raw':>7}"
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['page_size']:>5}  {row['impl']:<26} {row['input']:<6} "
            f"{row['pages_per_s']:>12,.0f} {row['us_per_page']:>8.3f} "
            f"{row['ratio_vs_raw_sha256']:>7.2f}"
        )


def main(argv: list[str]) -> int:
    positive = int_at_least(1)
    parser = CommandParser(prog="radixlink bench hash", description=__doc__)
    parser.add_argument("--num-tokens", type=positive, default=65536, help="tokens hashed per call")
    parser.add_argument("--page-sizes", type=positive, nargs="+", default=[16, 64])
    parser.add_argument("--rounds", type=positive, default=50, help="timed rounds; best is kept")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    parser.add_argument("--json", type=Path, default=None, help="write results to this file")
    args = parser.parse_args(argv)
    if args.num_tokens <= 0 or args.rounds <= 0 or min(args.page_sizes) <= 0:
        parser.error("--num-tokens, --rounds and --page-sizes must be positive")
    config = {
        "num_tokens": args.num_tokens,
        "page_sizes": args.page_sizes,
        "rounds": args.rounds,
        "seed": args.seed,
        "python": platform.python_version(),
        "openssl": ssl.OPENSSL_VERSION,
        "machine": platform.machine(),
    }
    print("radixlink bench hash: " + ", ".join(f"{k}={v}" for k, v in config.items()))
    print("raw = hashlib.sha256(page).digest() over pre-sliced page bytes, no chain;")
    print("raw hex = the same with .hexdigest() into a list (same output type as ours);")
    print("page_hashes = tokens in, chained hex digests out (conversion included); best round\n")
    rows: list[dict[str, Any]] = []
    for page_size in args.page_sizes:
        rows.extend(_measure(args.num_tokens, page_size, args.rounds, args.seed))
    _print_table(rows)
    ours = [r for r in rows if r["impl"] == "page_hashes sha256" and r["input"] == "numpy"]
    worst = min(r["ratio_vs_raw_sha256"] for r in ours)
    verdict = "meets" if worst >= TARGET_RATIO else "below"
    print(f"\npage_hashes sha256 (numpy) worst ratio {worst:.2f}: {verdict} target {TARGET_RATIO}")
    if args.json is not None:
        payload = {"bench": "hash", "config": config, "rows": rows, "worst_ratio": worst}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
