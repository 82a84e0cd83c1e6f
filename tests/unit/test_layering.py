"""Dependencies point one way (docs/architecture.md): every import between radixlink's parts,
at module level or inside a function, goes to a lower layer, and no modules import each other
in a cycle. Read from the source with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from radixlink.cli import BENCHES, COMMANDS

PACKAGE = Path(__file__).resolve().parents[2] / "radixlink"

# Lowest first. A part is a top-level module or subpackage of radixlink; a part may import its
# own modules and those of lower layers only.
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer) for layer in (
    {"contract", "errors", "seedmemo", "cost", "tokens"},
    {"hashing", "memory"},
    {"config", "stores", "metrics", "kvevents"},
    {"pages"},  # the page layer under the three adapters (linker, SGLang, vLLM): no tree
    {"cmdargs", "tree", "routing"},
    {"components", "checks"},
    {"eviction", "hybrid_slots", "nocache"},
    {"cache"},
    {"linker"},
    {"engine"},
    {"integrations"},
    {"bench"},
    {"cli", "__main__", "__init__"},
))
RANK = {part: rank for rank, layer in enumerate(LAYERS) for part in layer}
# The command modules ``cli`` dispatches to share its argparse helpers, wherever they live
# (``radixlink store`` lives in stores/).
COMMAND_MODULES = frozenset({*COMMANDS.values(), *BENCHES.values()})


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["radixlink", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__" and len(parts) > 2:
            parts.pop()
        out[".".join(parts)] = path
    return out


def _part(module: str) -> str:
    return module.split(".")[1]


def _imports(module: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, bool]]:
    """``(imported radixlink module, at module level)`` for each import in ``path``; imports
    under ``if TYPE_CHECKING:`` are skipped (they never run)."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]

    def walk(node: ast.AST, top: bool) -> Iterator[tuple[str, bool]]:
        for child in ast.iter_child_nodes(node):
            if (isinstance(child, ast.If) and isinstance(child.test, ast.Name)
                    and child.test.id == "TYPE_CHECKING"):
                continue
            here = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                yield from ((a.name, here) for a in child.names if a.name.startswith("radixlink"))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(up + ([child.module] if child.module else []))
                if base.startswith("radixlink"):
                    for alias in child.names:
                        full = f"{base}.{alias.name}"
                        yield (full if full in known else base), here
            yield from walk(child, here)

    yield from walk(ast.parse(path.read_text()), True)


def _edges() -> dict[str, set[tuple[str, bool]]]:
    known = _modules()
    return {m: set(_imports(m, p, known)) for m, p in known.items()}


def test_every_part_has_a_layer() -> None:
    """A new top-level module or subpackage must be placed in LAYERS."""
    parts = {_part(m) if m != "radixlink" else "__init__" for m in _modules()}
    assert parts <= set(RANK), f"place these in LAYERS: {sorted(parts - set(RANK))}"


def test_imports_point_down() -> None:
    """No import, at module level or inside a function, reaches a higher layer."""
    upward = []
    for module, imports in _edges().items():
        mine = RANK["__init__" if module == "radixlink" else _part(module)]
        for target, _ in imports:
            if target == "radixlink" or _part(target) == _part(module):
                continue
            if _part(target) == "cmdargs" and module in COMMAND_MODULES:
                continue
            if RANK[_part(target)] > mine:
                upward.append(f"{module} -> {target}")
    assert not upward, "imports that point up: " + ", ".join(sorted(upward))


def test_no_import_cycle_at_module_level() -> None:
    """No modules import each other in a cycle when they load (Tarjan's strongly connected
    components over module-level imports)."""
    graph = {m: {t for t, top in imports if top and t in _modules()}
             for m, imports in _edges().items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


# The engines' adapters reach radixlink through the page layer (DESIGN.md section 2): they keep
# their own trees, so they must not import radixlink's tree, its components or its linker (their
# demos may take the reference engine's workload and model export: ``engine`` is not listed).
ENGINE_ADAPTERS = ("radixlink.integrations.sglang", "radixlink.integrations.vllm")
TREE_SIDE = frozenset({"tree", "components", "eviction", "hybrid_slots", "nocache", "cache",
                       "linker", "checks"})


def test_engine_adapters_stand_on_the_page_layer() -> None:
    """SGLang's and vLLM's adapters import neither the tree nor its linker (module level or
    inside functions); their keys, presence, staging, I/O and restore rule are ``pages``'."""
    reached = sorted(f"{module} -> {target}" for module, imports in _edges().items()
                     if module.startswith(ENGINE_ADAPTERS)
                     for target, _ in imports if _part(target) in TREE_SIDE)
    assert not reached, "engine adapters reaching the tree side: " + ", ".join(reached)


# What only components and pools may name (issue #46: "the linker names no component type").
COMPONENT_NAMES = frozenset({"ComponentType", "KVPool", "MambaStatePool", "StateSlots",
                             "FullComponent", "SWAComponent", "MambaComponent", "SideComponent"})


def test_the_linker_names_no_component_type() -> None:
    """No module of ``linker/`` names a component type, a concrete component or pool class, or
    one pool by name (``PoolName.MAMBA``): a pool's part in a load comes from its component."""
    named = []
    for path in sorted((PACKAGE / "linker").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.id if isinstance(node, ast.Name) else \
                node.attr if isinstance(node, ast.Attribute) else None
            if isinstance(node, ast.ImportFrom):
                name = next((a.name for a in node.names if a.name in COMPONENT_NAMES), None)
            if name in COMPONENT_NAMES or (
                    isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "PoolName"):
                named.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {ast.unparse(node)}")
    assert not named, "the linker names components: " + ", ".join(named)
