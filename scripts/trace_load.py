"""What a maintainer feels following one LOAD or OFFLOAD: a ``sys.setprofile`` trace of every
radixlink function entered (every thread, so the store worker counts too), and from it

- files / functions entered, and the lines of their bodies (each distinct function once);
- forwarders: functions entered whose body (its docstring aside) is one call statement that
  passes values through (no call among its arguments) and that entered radixlink code (a
  method answering from its own dict is an accessor, not a hop);
- bounces: calls into a file already on that thread's radixlink call stack, from another
  file (the reader jumps back into a file it left), counted once per (caller, callee);
- tree matches: ``RadixTree.match`` calls (the same tokens matched again), tree walks
  (``RadixTree._walk``: matches and inserts), and locks taken (``LockTable.lock``).

The tree's scenarios (issue #23's): a ``memory://`` store; node A offloads a 64-token prompt
(``write_through``); node B, holding a 16-token device prefix, loads the rest through the
public API (match + LOOKUP -> load -> wait_load -> unlock). The same for a FULL+SWA+MAMBA cache.
The engines' scenarios run their scheduler-level harnesses (tests/engines/sglang, tests/engines/
vllm) in the engine's venv: SGLang's linker LOAD (.venv-sglang) and vLLM's worker LOAD
(.venv-vllm), each on a ``file://`` store. A scenario is a function in ``SCENARIOS``, skipped
where its imports fail. It measures the ``radixlink`` it imports: run it with
``PYTHONPATH=<a checkout>`` to measure another commit. Usage::

    python scripts/trace_load.py                 # a table
    .venv-sglang/bin/python scripts/trace_load.py --scenario sglang-linker-load
    .venv-vllm/bin/python scripts/trace_load.py --scenario vllm-worker-load
    python scripts/trace_load.py --json          # one JSON object
    python scripts/trace_load.py --files         # and the files each scenario entered
    python scripts/trace_load.py --markdown      # the table as docs/linker.md embeds it
    python scripts/trace_load.py --write-doc docs/linker.md   # replace the measured rows
"""

from __future__ import annotations

import argparse
import ast
import builtins
import functools
import json
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import radixlink
from radixlink import CacheConfig, ExternalCacheLinker, InsertParams, UnifiedCache
from radixlink.contract import PoolName
from radixlink.hashing import Namespace
from radixlink.memory.layout import KVLayout, StateLayout
from radixlink.stores.memory import MemoryStore

PACKAGE = str(Path(radixlink.__file__).resolve().parent)
ROOT = Path(PACKAGE).parent
PS = 4
LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype=torch.float32, page_size=PS)
STATE = StateLayout(shapes=((2, 3), (4,)), dtype=torch.float32)
PROMPT = list(range(1000, 1064))  # 64 tokens
DEVICE_PREFIX = 16
COUNTED = {"matches": "RadixTree.match", "walks": "RadixTree._walk", "locks": "LockTable.lock"}
BEGIN, END = "<!-- trace_load: begin -->", "<!-- trace_load: end -->"

Key = tuple[str, int, str]  # (file, first line, qualified name) of one function


@dataclass
class Run:
    """What one traced block entered."""

    functions: set[Key] = field(default_factory=set)
    calls: Counter[str] = field(default_factory=Counter)  # qualified name -> calls
    bounces: set[tuple[Key, Key]] = field(default_factory=set)  # (caller, callee)
    callers: set[Key] = field(default_factory=set)  # functions that entered radixlink code


class Tracer:
    """The profile function: records into ``run`` while one is set, on any thread. Installed
    once, before any linker starts its worker threads (Python 3.11 cannot profile running
    threads). Each thread keeps its stack of radixlink frames (for bounces)."""

    def __init__(self) -> None:
        self.run: Run | None = None
        self._stacks: dict[int, list[tuple[Any, str, Key]]] = {}

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        run = self.run
        if run is None or event not in ("call", "return"):
            return
        code = frame.f_code
        if not code.co_filename.startswith(PACKAGE):
            return
        stack = self._stacks.setdefault(threading.get_ident(), [])
        if event == "return":
            if stack and stack[-1][0] is frame:
                stack.pop()
            return
        key = (code.co_filename, code.co_firstlineno, code.co_qualname)
        run.functions.add(key)
        run.calls[code.co_qualname] += 1
        if stack:
            run.callers.add(stack[-1][2])
            top = stack[-1][1]
            if top != code.co_filename and any(f == code.co_filename for _, f, _ in stack):
                run.bounces.add((stack[-1][2], key))
        stack.append((frame, code.co_filename, key))

    @contextmanager
    def traced(self) -> Iterator[Run]:
        """Record what runs inside the block (the worker threads included)."""
        self._stacks = {}
        self.run = run = Run()
        try:
            yield run
        finally:
            self.run = None


TRACER = Tracer()

# ---------------------------------------------------------------- reading the functions


@functools.cache
def _defs(path: str) -> dict[int, ast.AST]:
    """The function definitions of a file, by the line their code object starts at (the first
    decorator's, else the ``def``'s)."""
    out: dict[int, ast.AST] = {}
    for node in ast.walk(ast.parse(Path(path).read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            out[first] = node
        elif isinstance(node, ast.Lambda):
            out.setdefault(node.lineno, node)
    return out


def body_lines(key: Key) -> int:
    """Source lines of the function, from its ``def`` to its last line (a lambda: 1)."""
    node = _defs(key[0]).get(key[1])
    if node is None or isinstance(node, ast.Lambda):
        return 1
    return node.end_lineno - node.lineno + 1  # type: ignore[attr-defined,no-any-return]


def is_forwarder(key: Key) -> bool:
    """The body (docstring aside) is one call statement, returned or not, of something other
    than a builtin, with no call among its arguments (``return min(a, b)`` computes,
    ``return self._accept(self.path_to(node))`` composes two steps; ``return
    self.table.lock(node)`` forwards)."""
    node = _defs(key[0]).get(key[1])
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], (ast.Return, ast.Expr)):
        return False
    call = body[0].value
    if not isinstance(call, ast.Call) or (
            isinstance(call.func, ast.Name) and call.func.id in dir(builtins)):
        return False
    args = [*call.args, *(k.value for k in call.keywords)]
    return not any(isinstance(n, ast.Call) for a in args for n in ast.walk(a))


def _rel(path: str) -> str:
    return Path(path).relative_to(ROOT).as_posix()


def measure(run: Run) -> dict[str, Any]:
    """The numbers of one run (see the module docstring)."""
    files = sorted({_rel(f) for f, _, _ in run.functions})
    return {
        "files": len(files),
        "functions": len(run.functions),
        "lines": sum(map(body_lines, run.functions)),
        "forwarders": sorted(f"{_rel(k[0])}:{k[2]}" for k in run.functions
                             if k in run.callers and is_forwarder(k)),
        "bounces": sorted(f"{_rel(a[0])}:{a[2]} -> {_rel(b[0])}:{b[2]}" for a, b in run.bounces),
        **{name: run.calls[qualname] for name, qualname in COUNTED.items()},
        "entered": files,
    }

# ---------------------------------------------------------------- the tree scenarios


def make_cache(kind: str) -> UnifiedCache:
    swa, mamba = "swa" in kind, "mamba" in kind
    return UnifiedCache(CacheConfig(
        page_size=PS, num_tokens=512, kv_layout=LAYOUT, namespace=Namespace(model="trace"),
        sliding_window=8 if swa else None, swa_num_tokens=512 if swa else None,
        swa_layout=LAYOUT if swa else None, mamba_num_states=16 if mamba else None,
        state_layout=STATE if mamba else None, enable_external_cache_linker=True))


def compute(cache: UnifiedCache, tokens: list[int]) -> None:
    """Serve ``tokens`` on ``cache`` with no store load: write some K/V, insert, unlock."""
    m = cache.match_prefix(tokens)
    handle = cache.lock(m.last_node)
    new = cache.alloc(len(tokens) - m.prefix_len)
    assert new is not None
    kv = torch.cat([m.device_indices, new])
    pool = cache.pool(PoolName.KV)
    for layer in range(LAYOUT.num_layers):
        pool.k(layer)[new] = float(layer + 1)
        pool.v(layer)[new] = -float(layer + 1)
    slot = None
    if cache.pool(PoolName.MAMBA) is not None:
        slot = cache.hybrid.alloc_state()
        cache.pool(PoolName.MAMBA).write_state(
            slot, torch.arange(STATE.state_bytes, dtype=torch.uint8))
    cache.insert(InsertParams(key=tokens, value=kv, prev_prefix_len=m.prefix_len,
                              mamba_value=slot))
    cache.unlock(handle)


def load(cache: UnifiedCache, linker: ExternalCacheLinker) -> int:
    """The public LOAD: match with LOOKUP, load, wait, unlock. Returns the restored prefix."""
    m = cache.match_prefix(PROMPT, req_id="b")
    assert m.external_hit_len, "the store should hold the prompt"
    assert linker.load("b")
    out = linker.wait_load("b", timeout=30)
    assert out.ok, out.reason
    cache.unlock(out.lock)
    return out.prefix_len


def tree_paths(kind: str) -> dict[str, Run]:
    """One OFFLOAD (node A) and one LOAD (node B) through the tree's linker."""
    store = MemoryStore()
    a_cache = make_cache(kind)
    a = ExternalCacheLinker(a_cache, store)
    b_cache = make_cache(kind)
    b = ExternalCacheLinker(b_cache, store)
    compute(b_cache, PROMPT[:DEVICE_PREFIX])
    # warm up: the first call of anything imports and builds; trace a second prompt's paths
    compute(a_cache, [7] * 64)
    assert a.flush(timeout=30)
    time.sleep(0.01)  # NOTE: past the batch window, so the traced offload goes out at once
    with TRACER.traced() as offload:
        compute(a_cache, PROMPT)
        assert a.flush(timeout=30)
    with TRACER.traced() as loading:
        prefix = load(b_cache, b)
    assert prefix == len(PROMPT), prefix
    a.close()
    b.close()
    return {"load": loading, "offload": offload}


@functools.cache
def _tree(kind: str) -> dict[str, Run]:
    return tree_paths(kind)


# ---------------------------------------------------------------- the engines' scenarios


def sglang_linker_load() -> Run:
    """SGLang's LOAD through ``RadixlinkLinker`` (run by .venv-sglang's python): the
    scheduler-level harness (tests/engines/sglang/harness.py: SGLang's own UnifiedRadixCache,
    its linker wrapper and factory, CPU pools, FULL). Node A serves and offloads the prompt on
    a ``file://`` store; node B, holding nothing, restores it as SGLang's scheduler does
    (match with LOOKUP, init_load_back, ready_to_load_host_cache, the per-layer waits,
    finish_external_linker_loads). Only radixlink's functions are counted."""
    sys.path.insert(0, str(ROOT))
    import tests.engines.sglang.conftest  # noqa: F401 - SGLang's import stand-ins (torchvision)
    from tests.engines.sglang.harness import FULL, Node

    with tempfile.TemporaryDirectory() as tmp:
        url = f"file://{tmp}/store"
        a, b = Node(FULL, url, seed=1), Node(FULL, url, seed=2)
        try:
            a.serve([7] * 64)  # NOTE: warm up: the first call of anything imports and builds
            b.restore([7] * 64, "warm")
            a.serve(PROMPT)
            with TRACER.traced() as run:
                got = b.restore(PROMPT, "b")
            assert (got.loaded_len, got.failed) == (len(PROMPT), False), got
        finally:
            a.close()
            b.close()
    return run


def vllm_worker_load() -> Run:
    """vLLM's LOAD through ``RadixlinkConnector`` (run by .venv-vllm's python): the
    scheduler-level harness (tests/engines/vllm/harness.py: vLLM's real Scheduler and
    KVCacheManager, one worker-role connector over CPU KV tensors, one full-attention group).
    Node 1 computes and saves a 100-token prompt on a ``file://`` store; node 2 steps until
    its 6 pages landed: the scheduler's lookup and load plan, the worker's batched read,
    verify and scatter. Only radixlink's functions are counted."""
    sys.path.insert(0, str(ROOT))
    from tests.engines.vllm.harness import Node, write_model_dir

    prompt = [(i * 37) % 997 + 3 for i in range(100)]
    with tempfile.TemporaryDirectory() as tmp:
        model, url = write_model_dir(Path(tmp) / "model"), f"file://{tmp}/store"
        one, two = Node(model, url), Node(model, url)
        try:
            for node, req in ((one, "warm"), (two, "warm2")):  # NOTE: warm up both roles
                node.add(req, [5] * 100)
                node.run()
            one.add("a", prompt)
            one.run()
            worker = two.workers[0].worker
            with TRACER.traced() as run:
                two.add("b", prompt)
                for _ in range(10):
                    two.step()
                    two.wait_io()
                    if worker.stats["loaded_pages"] >= 6:
                        break
            assert worker.stats["loaded_pages"] >= 6, worker.stats
            two.run()
        finally:
            one.close()
            two.close()
    return run


# label -> a function returning that path's run; an engine's path runs where its imports do
# (its venv) and is skipped elsewhere
SCENARIOS: dict[str, Callable[[], Run]] = {
    "FULL LOAD": lambda: _tree("full")["load"],
    "FULL OFFLOAD": lambda: _tree("full")["offload"],
    "FULL+SWA+MAMBA LOAD": lambda: _tree("swa+mamba")["load"],
    "SGLang linker LOAD": sglang_linker_load,
    "vLLM worker LOAD": vllm_worker_load,
}

# ---------------------------------------------------------------- output

COLUMNS = (("files", "files"), ("functions", "functions"), ("lines", "lines read"),
           ("forwarders", "forwarders"), ("bounces", "bounces"), ("matches", "tree matches"),
           ("walks", "tree walks"), ("locks", "locks"))


def _cell(value: Any) -> str:
    return str(len(value)) if isinstance(value, list) else f"{value:,}"


def markdown(rows: dict[str, dict[str, Any]]) -> str:
    """The table docs/linker.md embeds between its ``trace_load`` markers."""
    lines = ["| path | " + " | ".join(title for _, title in COLUMNS) + " |",
             "|---|" + "---:|" * len(COLUMNS)]
    for label, row in rows.items():
        lines.append(f"| {label} | " + " | ".join(_cell(row[k]) for k, _ in COLUMNS) + " |")
    return "\n".join(lines)


def write_doc(path: Path, rows: dict[str, dict[str, Any]]) -> None:
    """Replace the rows of ``rows``' paths in the table between the markers of ``path``; the
    rows of paths not measured here (another venv's engine) stay, in ``SCENARIOS`` order."""
    text = path.read_text()
    pattern = re.compile(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), re.S)
    found = pattern.search(text)
    if not found:
        raise SystemExit(f"{path} has no {BEGIN} ... {END} block")
    kept = {line.split("|")[1].strip(): line for line in found.group(1).splitlines()[2:]
            if line.startswith("| ")}
    table = markdown(rows).splitlines()
    fresh = {line.split("|")[1].strip(): line for line in table[2:]}
    order = [label for label in SCENARIOS if label in kept or label in fresh]
    body = [fresh.get(label) or kept[label] for label in order]
    block = "\n".join([*table[:2], *body])
    path.write_text(pattern.sub(lambda _: f"{BEGIN}\n{block}\n{END}", text))


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--files", action="store_true", help="list the files entered")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--write-doc", type=Path, metavar="PATH",
                        help="replace the measured paths' rows of the table between the "
                             "trace_load markers of PATH")
    parser.add_argument("--scenario", action="append", choices=[_slug(k) for k in SCENARIOS],
                        help="measure only this path (repeatable; default: every path whose "
                             "imports work here)")
    args = parser.parse_args(argv)
    chosen = {label: run for label, run in SCENARIOS.items()
              if not args.scenario or _slug(label) in args.scenario}
    threading.setprofile(TRACER)
    sys.setprofile(TRACER)
    rows: dict[str, dict[str, Any]] = {}
    for label, scenario in chosen.items():
        try:
            rows[label] = measure(scenario())
        except ImportError as exc:  # an engine's path outside its venv
            print(f"skipped {label}: {exc}", file=sys.stderr)
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    if args.write_doc:
        write_doc(args.write_doc, rows)
    if args.json:
        out = {label: {k: v for k, v in row.items() if args.files or k != "entered"}
               for label, row in rows.items()}
        print(json.dumps({"radixlink": PACKAGE, "paths": out}, indent=2))
        return 0
    if args.markdown:
        print(markdown(rows))
        return 0
    print(f"radixlink: {PACKAGE}")
    print(f"{'path':<22}" + "".join(f"{title:>14}" for _, title in COLUMNS))
    for label, row in rows.items():
        print(f"{label:<22}" + "".join(f"{_cell(row[k]):>14}" for k, _ in COLUMNS))
    for label, row in rows.items():
        if row["forwarders"] or row["bounces"]:
            print(f"\n{label}:")
            for name in row["forwarders"]:
                print(f"  forwarder  {name}")
            for name in row["bounces"]:
                print(f"  bounce     {name}")
        if args.files:
            print(f"\n{label} entered:\n  " + "\n  ".join(row["entered"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
