"""The shape of the package: no import cycle between its modules, no import that runs up the
declared layer order, no module past the size limit.

The imports are read with `ast`, not by importing: every `import` and `from ... import` counts,
at module level and inside functions (a lazy import is still a dependency; hiding one side of a
cycle in a function only moves the failure to run time). Imports under `if TYPE_CHECKING:` do
not count: they never execute, so they cannot make import order matter, and they are how an
annotation names a type from a module that depends on this one.

The layers (`LAYERS`) are the package's subpackages, one per stage of the eval loop, and its
top-level modules, lowest first: a module imports its own layer and the layers below it, never
one above. docs/architecture.md draws them; each subpackage's `__init__` says its place.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pytest_evalloop

PACKAGE = Path(pytest_evalloop.__file__).parent
MAX_LINES = 700
# Modules allowed past MAX_LINES for now, each with who is splitting it. Keep this list short:
# a module lands here only while its split is under way, and leaves it when the split merges.
OVER_LIMIT: dict[str, str] = {}
# The layer order, lowest first: (name, units). A unit is a subpackage or a top-level module of
# the package, named without the `pytest_evalloop.` prefix; `pytest_evalloop` is the package's
# own `__init__`. The bottom is what every layer may import (the error types, the GC policy); the
# pytest face (hooks, options, items, the session's runs, the terminal) sits above every stage,
# and the skills plugin and the test fakes above it. A new subpackage or top-level module gets
# its place here (test_every_unit_has_one_layer says so).
STAGES = (
    "sets",
    "model_api",
    "judge",
    "ledger",
    "measure",
    "roles",
    "targets",
    "answer",
    "goldens",
    "diagnose",
    "report",
    "improve",
    "review",
    "session",
    "scale",
)
"""The subpackages of the loop's stages (and `roles`, the records they exchange), lowest first:
each is a layer of its own."""
FACE = (
    "plugin",
    "options",
    "hookspecs",
    "items",
    "runtime",
    "latch",
    "lookahead",
    "settargets",
    "startchecks",
    "progress",
    "display",
    "summary",
    "shortsummary",
    "keptreports",
    "freedmemory",
    "otherplugins",
    "scaffold",
)
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("bottom", ("pytest_evalloop", "failures", "steps", "identity", "stash")),
    *((stage, (stage,)) for stage in STAGES),
    ("pytest face", FACE),
    ("skills", ("skills",)),
    ("testing", ("testing",)),
    # `evalloop demo` starts the fake for a user; the command line reaches every layer.
    ("demo", ("demo",)),
    ("command line", ("cli",)),
]


def _modules(package: Path = PACKAGE) -> dict[str, tuple[Path, bool]]:
    found: dict[str, tuple[Path, bool]] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = (path, is_package)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import in the tree, at any depth, skipping the bodies of `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The modules an import names: `import a.b`, `from a import b` (b may be a module), and
    relative forms (`from . import x`, `from ..y import z`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([node.module] if node.module else [])])
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (top-level and nested)."""
    modules = _modules(package)
    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        graph[module] = {
            target
            for node in _import_nodes(tree)
            for target in _targets(node, module, is_package)
            if target in modules and target != module
        }
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of modules, as a closed path `a -> b -> a`."""
    return [_cycle_in(graph, group) for group in tangled_groups(graph)]


def tangled_groups(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module (each holds a cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm; the package is far below the depth limit
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def _cycle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest closed path through the group's first module, for the failure message."""
    start = min(group)
    paths = {start: [start]}
    todo = [start]
    while todo:
        node = todo.pop(0)
        for nxt in sorted(graph[node] & group):
            if nxt == start:
                return [*paths[node], start]
            if nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                todo.append(nxt)
    raise AssertionError(f"no cycle through {start}")  # a strongly connected group has one


def unit_of(module: str) -> str:
    """The layer unit a module belongs to: `pkg.measure.gate` -> `measure`, `pkg` -> `pkg`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(
    graph: dict[str, set[str]], layers: list[tuple[str, tuple[str, ...]]]
) -> list[str]:
    """One line per import from a lower layer into a higher one, naming both modules and layers."""
    place = {unit: (rank, name) for rank, (name, units) in enumerate(layers) for unit in units}
    found = []
    for module in sorted(graph):
        low = place[unit_of(module)]
        for target in sorted(graph[module]):
            high = place[unit_of(target)]
            if high[0] > low[0]:
                found.append(
                    f"{module} (layer {low[0]}, {low[1]}) imports {target} "
                    f"(layer {high[0]}, {high[1]})"
                )
    return found


def test_every_unit_has_one_layer() -> None:
    declared = [unit for _, units in LAYERS for unit in units]
    twice = sorted({unit for unit in declared if declared.count(unit) > 1})
    assert not twice, f"units declared in more than one layer of LAYERS: {twice}"
    units = {unit_of(module) for module in _modules()}
    missing = sorted(units - set(declared))
    assert not missing, (
        f"subpackages or top-level modules with no layer: {missing}; give each its place in "
        "LAYERS (tests/test_architecture.py) and in docs/architecture.md"
    )
    stale = sorted(set(declared) - units)
    assert not stale, f"LAYERS names units the package no longer has: {stale}"


def test_no_import_runs_up_the_layers() -> None:
    upward = upward_imports(import_graph(), LAYERS)
    assert not upward, (
        "imports from a lower layer into a higher one (the order is LAYERS in "
        "tests/test_architecture.py, lowest first); move the name imported down to the lowest "
        "layer that owns it, or import it under `if TYPE_CHECKING:` when only an annotation "
        "needs it:\n" + "\n".join(f"  {line}" for line in upward)
    )


def test_subpackages_re_export_nothing() -> None:
    """A subpackage's `__init__` is its docstring (what it owns, what it may import) and no code,
    so every importer names the module that owns a name. `testing` keeps its lazy public names
    (`from pytest_evalloop.testing import FakeAnthropic`), which users import."""
    for module, (path, is_package) in _modules().items():
        if not is_package or module == PACKAGE.name or unit_of(module) == "testing":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert ast.get_docstring(tree), f"{module} has no docstring: say what it owns"
        code = [
            node
            for node in tree.body[1:]
            if not (isinstance(node, ast.ImportFrom) and node.module == "__future__")
        ]
        assert not code, f"{path} holds code beyond its docstring (line {code[0].lineno})"


def test_no_import_cycle() -> None:
    graph = import_graph()
    groups = tangled_groups(graph)
    assert not groups, "import cycles in pytest_evalloop:\n" + "\n".join(
        f"  {' -> '.join(_cycle_in(graph, group))}   (tangled: {', '.join(sorted(group))})"
        for group in groups
    )


def _load_time_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The imports that run when the module loads: module and class bodies, not functions, not
    `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def needless_lazy_imports(package: Path = PACKAGE) -> list[str]:
    """`path:line module` for each import inside a function of a module the function's own
    module already loads when it loads (itself or through what it imports): such an import keeps
    nothing off the start-up path, it only hides a dependency from the reader."""
    modules = _modules(package)
    trees = {
        m: ast.parse(p.read_text(encoding="utf-8"), filename=str(p))
        for m, (p, _) in modules.items()
    }
    loads: dict[str, set[str]] = {}
    for module, (_path, is_package) in modules.items():
        named = {
            target
            for node in _load_time_imports(trees[module])
            for target in _targets(node, module, is_package)
        }
        # importing a.b.c loads a and a.b first
        loads[module] = {
            ".".join(name.split(".")[:i])
            for name in named | {module}
            for i in range(1, name.count(".") + 2)
        } & modules.keys()
    found = []
    for module, (path, is_package) in modules.items():
        loaded, todo = set(), [module]
        while todo:
            for target in loads[todo.pop()] - loaded:
                loaded.add(target)
                todo.append(target)
        eager = {id(node) for node in _load_time_imports(trees[module])}
        for node in _import_nodes(trees[module]):
            if id(node) in eager:
                continue
            named = [t for t in _targets(node, module, is_package) if t in modules]
            if named and max(named, key=len) in loaded:
                found.append(
                    f"{path.relative_to(package.parent)}:{node.lineno} {max(named, key=len)}"
                )
    return sorted(found)


def test_an_import_inside_a_function_keeps_a_module_off_the_load_path() -> None:
    """An import inside a function is for a module (and what it loads: pydantic models, DuckDB,
    the SDKs) that callers of the module's other functions should not pay for at start-up; one
    the module already loads when it loads only hides the dependency from the reader."""
    assert needless_lazy_imports() == [], (
        "imports inside functions of modules their module already loads; import them at the top"
    )


def _hookimpl_marked(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "hookimpl":
            return True
    return False


def test_every_hookimpl_marker_sits_on_a_hook() -> None:
    # A helper written between a hook's decorator and the hook takes the marker: pluggy then
    # registers nothing under the hook's own name for it, and the hook loses its ordering.
    stray = [
        f"{module}:{node.lineno} {node.name}"
        for module, (path, _) in _modules().items()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and _hookimpl_marked(node)
        and not node.name.startswith("pytest_")
    ]
    assert not stray, f"hookimpl markers on functions that are no hook: {stray}"


def test_no_module_over_the_line_limit() -> None:
    sizes = {
        module: len(path.read_text(encoding="utf-8").splitlines())
        for module, (path, _) in _modules().items()
    }
    over = {m: n for m, n in sizes.items() if n > MAX_LINES and m not in OVER_LIMIT}
    assert not over, (
        f"modules over {MAX_LINES} lines (split them along what they own): "
        + ", ".join(f"{m} ({n})" for m, n in sorted(over.items()))
    )
    stale = [m for m in OVER_LIMIT if sizes.get(m, 0) <= MAX_LINES]
    assert not stale, (
        f"allowed over {MAX_LINES} lines but no longer are: drop {stale} from OVER_LIMIT"
    )


def test_the_layer_check_names_both_modules_and_layers(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low" / "__init__.py").write_text("")
    (package / "low" / "a.py").write_text("def f():\n    from pkg.high import b\n")
    (package / "high.py").write_text("from pkg.low import a\n")
    (package / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.high\n"
    )
    layers = [("bottom", ("pkg", "typed")), ("low", ("low",)), ("high", ("high",))]
    assert upward_imports(import_graph(package), layers) == [
        "pkg.low.a (layer 1, low) imports pkg.high (layer 2, high)"
    ]


@pytest.mark.parametrize(
    ("files", "cycle"),
    [
        pytest.param(
            {"a.py": "import pkg.b\n", "b.py": "def f():\n    from pkg import a\n"},
            ["pkg.a", "pkg.b", "pkg.a"],
            id="lazy-import-in-a-function",
        ),
        pytest.param(
            {
                "a.py": "from . import b\n",
                "b.py": "from .c import x\n",
                "c.py": "from .a import y\n",
            },
            ["pkg.a", "pkg.b", "pkg.c", "pkg.a"],
            id="relative-imports",
        ),
        pytest.param(
            {
                "a.py": "import pkg.b\n",
                "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n",
            },
            None,
            id="type-checking-only",
        ),
    ],
)
def test_the_checker_finds_what_it_should(
    tmp_path: Path, files: dict[str, str], cycle: list[str] | None
) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, text in files.items():
        (package / name).write_text(text)
    assert import_cycles(import_graph(package)) == ([cycle] if cycle else [])
