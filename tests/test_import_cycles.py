"""No import cycles in localchat/: every import counts (module level, inside functions,
under TYPE_CHECKING; absolute and relative), read with ast, nothing imported. No module
imports another's private (_name) names, or uses a private attribute that only another
module defines (obj._name where _name is set or defined elsewhere, not here). And
localchat.models, which the engines, the UI, the CLI and the server all use, reaches none
of them, directly or through others."""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "localchat"


def parsed(path: Path) -> ast.Module:
    """The file's syntax tree, parsed once per version of it (the tests walk the same files)."""
    stat = path.stat()
    return _parse(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=None)
def _parse(path: Path, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def module_names(root: Path) -> dict[str, Path]:
    """{dotted name: file} of every module under root (a package's name is its __init__)."""
    names = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported(module: str, path: Path, names: dict[str, Path]) -> set[str]:
    """The modules of the package that `module` imports anywhere in its file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # `from pkg import mod` imports the module pkg.mod
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in names else base)
    return {name for name in found if name in names and name != module}


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    names = module_names(root)
    return {module: imported(module, path, names) for module, path in names.items()}


def reached_from(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """{module: the module that imports it} for everything importing `start` runs: what it
    imports, those modules' imports, and the packages (__init__) above each of them."""
    found: dict[str, str] = {}
    todo = [start]
    while todo:
        module = todo.pop()
        parts = module.split(".")
        parents = {".".join(parts[:i]) for i in range(1, len(parts))} & graph.keys()
        for nxt in sorted(graph.get(module, set()) | parents):
            if nxt != start and nxt not in found:
                found[nxt] = module
                todo.append(nxt)
    return found


def layer_breaches(graph: dict[str, set[str]], package: str,
                   above: tuple[str, ...]) -> list[str]:
    """Each chain of imports from a module in `package` to one in a package of `above`."""
    def inside(module: str, pkg: str) -> bool:
        return module == pkg or module.startswith(pkg + ".")

    breaches = []
    for start in sorted(m for m in graph if inside(m, package)):
        via = reached_from(graph, start)
        for target in sorted(t for t in via if any(inside(t, pkg) for pkg in above)):
            chain = [target]
            while chain[-1] != start:
                chain.append(via[chain[-1]])
            breaches.append(" -> ".join(reversed(chain)))
    return breaches


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search, sorted for a stable answer)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from .. import a\n")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.a"]


def write_package(root: Path, files: dict[str, str]) -> Path:
    """A package at root holding files ({relative path: source}), each folder a package."""
    for relative, source in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(source)
    for folder in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        if not (folder / "__init__.py").exists():
            (folder / "__init__.py").write_text("")
    return root


def test_layer_breaches_are_found_through_other_modules_and_packages(tmp_path):
    pkg = write_package(tmp_path / "pkg", {
        "models/a.py": "from pkg.util import b\n",
        "util/b.py": "def f():\n    from ..engine import c\n",
        "engine/c.py": "",
        "util/__init__.py": "import pkg.engine\n"})
    graph = import_graph(pkg)
    assert layer_breaches(graph, "pkg.models", ("pkg.engine",)) == [
        "pkg.models.a -> pkg.util.b -> pkg.util -> pkg.engine",
        "pkg.models.a -> pkg.util.b -> pkg.engine.c",
    ]
    (pkg / "util" / "b.py").write_text("")
    (pkg / "util" / "__init__.py").write_text("")
    assert layer_breaches(import_graph(pkg), "pkg.models", ("pkg.engine",)) == []


def test_models_reach_no_engine_ui_cli_or_server():
    above = ("localchat.engine", "localchat.tui", "localchat.cli", "localchat.server")
    assert layer_breaches(import_graph(), "localchat.models", above) == []


def test_localchat_has_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_private_names_are_imported_from_other_modules():
    private = []
    for module, path in module_names(PACKAGE).items():
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "")
                                                     .startswith("localchat")):
                private += [f"{module}: {node.module}.{alias.name}" for alias in node.names
                            if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert private == []


def own_names(tree: ast.AST) -> set[str]:
    """The names a module defines: functions, classes, arguments, assigned names and
    attributes (self._x = ...)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def private_reach(root: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: the private attributes it uses that other modules of root define and it
    does not} (obj._name; a third-party library's privates are not counted)."""
    trees = {module: parsed(path) for module, path in module_names(root).items()}
    owns = {module: own_names(tree) for module, tree in trees.items()}
    reach = {}
    for module, tree in trees.items():
        elsewhere = set().union(*(names for other, names in owns.items() if other != module))
        used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                and node.attr.startswith("_") and not node.attr.startswith("__")}
        if found := {name for name in used - owns[module] if name in elsewhere}:
            reach[module] = found
    return reach


def test_private_reach_sees_a_mixin_calling_another_modules_private(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "app.py").write_text("class App:\n    def _error(self): self._busy = 1\n")
    (pkg / "controls.py").write_text("class Controls:\n    def go(self):\n"
                                     "        self._error()\n        self._own = self._own\n")
    assert private_reach(pkg) == {"pkg.controls": {"_error"}}


def test_no_module_uses_another_modules_private_attributes():
    assert private_reach() == {}


# Layers, lowest first: a module may import its own layer and those below, never above.
# Top-level modules (errors, message, units, ...) are the bottom; __main__ is the entry point.
LAYERS = (
    ("prompt", "formats"),
    ("models", "storage"),
    ("engine",),
    ("bench", "chat"),
    ("tui", "server"),
    ("cli",),
    ("__main__",),
)


def layer_of(module: str) -> int:
    """0 for localchat's top-level modules, else 1 + the index of the package's layer."""
    parts = module.split(".")
    if len(parts) == 1:
        return 0
    for i, packages in enumerate(LAYERS):
        if parts[1] in packages:
            return i + 1
    return 0


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a module to one in a higher layer (and tui <-> server, which sit
    side by side and must not know each other)."""
    found = []
    for module, deps in sorted(graph.items()):
        for dep in sorted(deps):
            side_by_side = (layer_of(dep) == layer_of(module) and dep.split(".")[1:2]
                            != module.split(".")[1:2] and layer_of(module) == 5)
            if layer_of(dep) > layer_of(module) or side_by_side:
                found.append(f"{module} -> {dep}")
    return found


def test_layer_order_sees_an_upward_import(tmp_path):
    pkg = write_package(tmp_path / "localchat", {
        "models/a.py": "def f():\n    from localchat.engine import b\n",
        "engine/b.py": "from localchat.models import a\n",
        "server/c.py": "from localchat.cli import d\n",
        "cli/d.py": "from localchat.server import c\n"})
    assert upward_imports(import_graph(pkg)) == ["localchat.models.a -> localchat.engine.b",
                                                 "localchat.server.c -> localchat.cli.d"]


def test_imports_only_run_downward():
    assert upward_imports(import_graph()) == []
def test_formats_reach_no_engine_or_anything_above():
    above = ("localchat.engine", "localchat.chat", "localchat.models", "localchat.prompt",
             "localchat.tui", "localchat.cli", "localchat.server", "localchat.storage")
    assert layer_breaches(import_graph(), "localchat.formats", above) == []
