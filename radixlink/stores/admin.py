"""``radixlink store stats|ls|gc|clear URL``: inspect and maintain a store from the shell.

Owns argument parsing and printing; all work goes through the public ``Store`` methods.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from radixlink.cmdargs import CommandParser, int_at_least
from radixlink.stores.base import Store
from radixlink.stores.keys import KEY_PREFIX, is_page_key, namespace_of
from radixlink.stores.registry import open_store

FOREIGN = "(not radixlink)"


def _human(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(num_bytes) < 1024 or unit == "TiB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    raise AssertionError("unreachable")


def printable(text: str) -> str:
    """``text`` safe for a terminal: backslash and every non-printable character (escape
    sequences, control characters, newlines) as a Python-style escape. Keys come from anyone
    who can write the store, so they are never printed raw."""
    return "".join(ch if ch.isprintable() and ch != "\\" else _escape(ch) for ch in text)


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch == "\\":
        return "\\\\"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _prefix(namespace: str | None) -> str:
    return f"{KEY_PREFIX}{namespace}/" if namespace is not None else ""


def _stats(store: Store, args: argparse.Namespace) -> int:
    for name, value in store.stats().items():
        print(f"{name:>18}: {printable(str(value))}")
    pages: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for key, size in store.scan(_prefix(args.namespace)):
        namespace = namespace_of(key) or FOREIGN
        pages[namespace] += 1
        sizes[namespace] += size
    print(f"\n{'namespace':<40} {'pages':>10} {'bytes':>12}")
    for namespace, count in pages.most_common():
        print(f"{printable(namespace):<40} {count:>10} {_human(sizes[namespace]):>12}")
    print(f"{'total':<40} {sum(pages.values()):>10} {_human(sum(sizes.values())):>12}")
    return 0


def _ls(store: Store, args: argparse.Namespace) -> int:
    shown = 0
    for key, size in store.scan(_prefix(args.namespace)):
        if shown >= args.limit:
            print(f"... (more; raise --limit, now {args.limit})")
            break
        print(f"{size:>12}  {printable(key)}")
        shown += 1
    return 0


def _gc(store: Store, args: argparse.Namespace) -> int:
    removed = store.gc()
    stats = store.stats()
    print(f"removed {removed} pages; now {stats.get('pages')} pages, {stats.get('bytes')} bytes")
    return 0


def _clear(store: Store, args: argparse.Namespace) -> int:
    prefix = _prefix(args.namespace)  # NOTE: "" (the whole store) only with --all
    if not args.yes:
        num_pages = sum(1 for key, _ in store.scan(prefix) if is_page_key(key))
        what = "the whole store" if args.all else f"namespace {args.namespace}"
        print(f"would delete {num_pages} pages of {what}; pass --yes to do it", file=sys.stderr)
        return 2
    print(f"deleted {store.clear(prefix)} pages")
    return 0


ACTIONS = {"stats": _stats, "ls": _ls, "gc": _gc, "clear": _clear}
READ_ONLY_ACTIONS = ("stats", "ls")


def _namespace(text: str) -> str:
    if not text or "/" in text:
        raise argparse.ArgumentTypeError(
            f"expected a namespace id (as `radixlink store stats` lists them), got {text!r}; "
            "use --all for every namespace"
        )
    return text


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = CommandParser(prog="radixlink store", description=__doc__)
    parser.add_argument("action", choices=sorted(ACTIONS))
    parser.add_argument("url", help="store URL, e.g. file://~/.cache/radixlink/store")
    parser.add_argument("--namespace", type=_namespace, help="only keys of this namespace id")
    parser.add_argument("--all", action="store_true", help="clear: every namespace")
    parser.add_argument("--limit", type=int_at_least(1), default=100,
                        help="ls: most keys to print")
    parser.add_argument("--yes", action="store_true", help="clear: really delete")
    args = parser.parse_args(argv)
    if args.action == "clear" and (args.namespace is None) == (not args.all):
        parser.error("clear needs exactly one of --namespace ID or --all")
    if args.action != "clear" and args.all:
        parser.error("--all applies to clear only")
    return args


def main(argv: list[str]) -> int:
    """Entry point of ``radixlink store``; returns the exit status.

    ``stats`` and ``ls`` open the store read-only (nothing created, evicted or deleted);
    ``clear`` needs an explicit ``--namespace ID`` or ``--all``.

    Raises:
        ValueError: bad arguments or a bad URL (the CLI prints one line, exit status 2).
        StoreError: the store is unreachable or missing.
    """
    args = _parse(argv)
    with open_store(args.url, read_only=args.action in READ_ONLY_ACTIONS) as store:
        return ACTIONS[args.action](store, args)
