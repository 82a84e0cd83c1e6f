"""Small helpers shared by the benchmarks: timing, one table, JSON output, common flags.

Owns no benchmark logic; must not import anything from radixlink beyond the standard library.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


def parse_tokens(text: str) -> int | None:
    """``"inf"`` -> None; ``"65536"``, ``"64K"``, ``"2M"`` (powers of 1024) -> tokens. An
    argparse ``type`` (its ``ArgumentTypeError`` is a ``ValueError``).

    Raises:
        argparse.ArgumentTypeError: not a positive token count nor ``inf``.
    """
    text = text.strip().lower()
    if text == "inf":
        return None
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(text[-1:], 1)
    try:
        value = int(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected tokens like 65536, 64K or inf, got {text!r}"
                                         ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"token counts must be positive, got {text!r}")
    return value


def best_of_interleaved(
    cases: Mapping[str, Callable[[], object]], repeat: int = 5, number: int = 1
) -> dict[str, float]:
    """Seconds per call of each case: the best of ``repeat`` rounds of ``number`` calls, run
    round by round so load spikes hit all alike (one untimed call of each warms up first)."""
    if repeat <= 0 or number <= 0:
        raise ValueError(f"repeat={repeat} and number={number} must be positive")
    for fn in cases.values():
        fn()
    best = {name: math.inf for name in cases}
    for _ in range(repeat):
        for name, fn in cases.items():
            start = time.perf_counter()
            for _ in range(number):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / number)
    return best


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def print_table(rows: Sequence[Mapping[str, object]], title: str) -> None:
    """Print ``rows`` (dicts sharing keys; the first row's keys are the columns) as a table."""
    print(title)
    if not rows:
        print("  (no rows)")
        return
    columns = list(rows[0])
    cells = [[_cell(row.get(col, "")) for col in columns] for row in rows]
    widths = [max(len(col), *(len(r[i]) for r in cells)) for i, col in enumerate(columns)]
    print("  ".join(col.rjust(w) for col, w in zip(columns, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON (creating parent folders)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def machine_info() -> dict[str, str]:
    """A few facts about where a benchmark ran, for its JSON."""
    import torch  # NOTE: lazy, so benchmarks that do not need torch stay light

    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or "unknown",
        "torch": torch.__version__,
        "torch_threads": str(torch.get_num_threads()),
    }


def add_common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the flags every benchmark takes: ``--json PATH``."""
    parser.add_argument("--json", metavar="PATH", default=None, help="also write results as JSON")
    return parser
