"""Command line: `radixlink demo|bench|store ...`. Argparse only; the work lives in library modules.

Each subcommand module exposes ``main(argv: list[str]) -> int`` and is imported lazily, so
optional dependencies (redis, matplotlib, the model packages) load only when used. A user error
(bad arguments, a bad or unreachable store URL) prints one line and exits 2; ``--debug`` shows
the traceback instead.
"""

from __future__ import annotations

import importlib
import sys

from radixlink.cmdargs import UsageError
from radixlink.errors import StoreError

COMMANDS: dict[str, str] = {
    "demo": "radixlink.engine.demo",
    "store": "radixlink.stores.admin",
}

BENCHES: dict[str, str] = {
    "memory": "radixlink.bench.memory",
    "hash": "radixlink.bench.hash",
    "tree": "radixlink.bench.tree",
    "peers": "radixlink.bench.peers",
    "store": "radixlink.bench.store",
    "linker": "radixlink.bench.linker",
    "trace": "radixlink.bench.trace",
    "cluster": "radixlink.bench.cluster",
    "e2e": "radixlink.bench.e2e",
    "vllm": "radixlink.bench.vllm_engine",
    "sglang": "radixlink.bench.sglang_engine",
    "all": "radixlink.bench.all",
}

_USAGE = """usage: radixlink [--debug] COMMAND [ARGS]

commands:
  demo                 run the main job: nodes sharing a store, checked against cache-off
  bench NAME           run a benchmark: {benches}
  store ACTION URL     inspect a store: stats | ls | gc | clear

--debug                print the traceback of an error instead of one line
"""

# What to do about each kind of user error, appended to its one-line message.
_FIXES: tuple[tuple[type[BaseException], str], ...] = (
    (StoreError, "check that the store is up and reachable and that the URL is right"),
    (ImportError, "install the missing package"),
    (OSError, "check the path and its permissions"),
)


def one_line(exc: BaseException) -> str:
    """The error message of ``exc`` on one line, with what to do about it (messages that
    carry their own advice after a "; " keep it)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, ValueError) or "; " in text:
        return text
    fix = next((fix for kind, fix in _FIXES if isinstance(exc, kind)), "")
    return f"{text}; {fix}" if fix else text


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    args = [arg for arg in args if arg != "--debug"]
    usage = _USAGE.format(benches=", ".join(BENCHES))
    if not args or args[0] in ("-h", "--help"):
        print(usage)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "bench":
        if not rest or rest[0] not in BENCHES:
            print(f"radixlink bench: choose one of {', '.join(BENCHES)}", file=sys.stderr)
            return 2
        name = f"bench {rest[0]}"
        module_name, rest = BENCHES[rest[0]], rest[1:]
    elif command in COMMANDS:
        name, module_name = command, COMMANDS[command]
    else:
        print(f"radixlink: unknown command {command!r}; run radixlink --help", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(module_name)
        return int(module.main(rest) or 0)
    except (ValueError, StoreError, ImportError, OSError) as exc:
        if debug:
            raise
        more = "" if isinstance(exc, UsageError) else " (--debug shows the traceback)"
        print(f"radixlink {name}: error: {one_line(exc)}{more}", file=sys.stderr)
        return 2
