"""Command line: `radixlink demo|bench|store ...`. Argparse only; the work lives in library modules.

Each subcommand module exposes ``main(argv: list[str]) -> int`` and is imported lazily, so
optional dependencies (redis, matplotlib, the model packages) load only when used.
"""

from __future__ import annotations

import importlib
import sys

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
    "trace": "radixlink.bench.trace",
    "e2e": "radixlink.bench.e2e",
    "all": "radixlink.bench.all",
}

_USAGE = """usage: radixlink COMMAND [ARGS]

commands:
  demo                 run the main job: nodes sharing a store, checked against cache-off
  bench NAME           run a benchmark: {benches}
  store ACTION URL     inspect a store: stats | ls | gc | clear
"""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    usage = _USAGE.format(benches=", ".join(BENCHES))
    if not args or args[0] in ("-h", "--help"):
        print(usage)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "bench":
        if not rest or rest[0] not in BENCHES:
            print(f"radixlink bench: choose one of {', '.join(BENCHES)}", file=sys.stderr)
            return 2
        module_name, rest = BENCHES[rest[0]], rest[1:]
    elif command in COMMANDS:
        module_name = COMMANDS[command]
    else:
        print(f"radixlink: unknown command {command!r}\n\n{usage}", file=sys.stderr)
        return 2
    module = importlib.import_module(module_name)
    return int(module.main(rest) or 0)
