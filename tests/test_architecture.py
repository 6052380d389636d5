"""The dependency rule, checked mechanically: imports only point down the layers (docs/architecture.md).

    app  ->  engine/service  ->  store  ->  foundation
    engine: service -> session -> analysis -> measure -> {drafts, models} -> core   (and all -> foundation)

Only engine/service/ touches the store; the app never does directly, and takes the engine only through its facade,
engine.service.api (never a command-line module: cli/, *_cli), and engine.errors; foundation/ imports nothing of
ours.
Imports are read with ast from every file, function-local imports and importlib.import_module("...") calls
included; the store's independence from the engine and the app is also checked by really importing every
store module in a fresh interpreter. A failure lists every offending import as path:line.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("foundation", "store", "engine", "app")


@dataclass(frozen=True)
class Import:
    path: Path  # relative to ROOT
    line: int
    module: str  # the importing module, dotted
    target: str  # what it imports, dotted and absolute; `from a.b import c` gives "a.b.c"
    local: bool  # inside a function (or a lambda): runs only when called

    def __str__(self) -> str:
        where = "function-local " if self.local else ""
        return f"{self.path}:{self.line}: {self.module} {where}imports {self.target}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def python_files(top: str) -> list[Path]:
    return sorted(p for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


class _Collector(ast.NodeVisitor):
    def __init__(self, path: Path, module: str, is_package: bool) -> None:
        self.path = path
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.depth = 0  # how many function bodies we are inside
        self.found: list[Import] = []

    def _add(self, node: ast.AST, target: str) -> None:
        self.found.append(Import(self.path, node.lineno, self.module, target, self.depth > 0))  # type: ignore[attr-defined]

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:  # relative: resolve against this module's package
            parts = self.package.split(".")
            anchor = parts[: len(parts) - node.level + 1]
            base = ".".join(anchor + ([node.module] if node.module else []))
        for alias in node.names:
            self._add(node, base if alias.name == "*" else f"{base}.{alias.name}")

    def visit_Call(self, node: ast.Call) -> None:  # importlib.import_module("x.y") / __import__("x.y")
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in ("import_module", "__import__") and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and not arg.value.startswith("."):
                self._add(node, arg.value)
        self.generic_visit(node)


def imports_in(source: str, path: Path, module: str, is_package: bool = False) -> list[Import]:
    collector = _Collector(path, module, is_package)
    collector.visit(ast.parse(source, filename=str(path)))
    return collector.found


def imports_of(path: Path) -> list[Import]:
    source = path.read_text(encoding="utf-8")
    return imports_in(source, path.relative_to(ROOT), module_name(path), path.name == "__init__.py")


def all_imports(top: str) -> list[Import]:
    return [imp for path in python_files(top) for imp in imports_of(path)]


def within(target: str, *packages: str) -> bool:
    """Whether dotted `target` is one of `packages` or inside one of them."""
    return any(target == p or target.startswith(p + ".") for p in packages)


def report(violations: list[Import], rule: str) -> str:
    return f"{rule} -- {len(violations)} violation(s):\n  " + "\n  ".join(str(v) for v in violations)


# --- the collector itself ---------------------------------------------------------------------------


def test_collector_sees_every_kind_of_import() -> None:
    source = (
        "import store\n"
        "from engine.analysis import theory\n"
        "from .. import session\n"
        "from .records import StepRecord\n"
        "def f():\n"
        "    import importlib\n"
        "    from store.db import make_engine\n"
        "    return importlib.import_module('app.data')\n"
    )
    found = imports_in(source, Path("engine/core/probe.py"), "engine.core.probe")
    assert {(imp.line, imp.target, imp.local) for imp in found} == {
        (1, "store", False),
        (2, "engine.analysis.theory", False),
        (3, "engine.session", False),
        (4, "engine.core.records.StepRecord", False),
        (6, "importlib", True),
        (7, "store.db.make_engine", True),
        (8, "app.data", True),
    }


# --- (a) the store stands alone ---------------------------------------------------------------------


def test_importing_the_store_loads_no_engine_or_app() -> None:
    code = (
        "import importlib, json, pkgutil, sys\n"
        "import store\n"
        "names = ['store'] + sorted(m.name for m in pkgutil.walk_packages(store.__path__, 'store.'))\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "leaked = sorted(m for m in sys.modules if m.split('.')[0] in ('engine', 'app'))\n"
        "print(json.dumps({'imported': names, 'leaked': leaked}))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # every importable store module was imported (store/migrations is loaded by Alembic, not imported)
    expected = {module_name(p) for p in python_files("store") if "migrations" not in p.parts}
    assert set(result["imported"]) == expected
    assert result["leaked"] == [], f"importing every store module also imported {result['leaked']}"


# --- (b)-(e) who may import whom ----------------------------------------------------------------------


def test_only_engine_service_imports_the_store() -> None:
    bad = [
        imp for imp in all_imports("engine") if within(imp.target, "store") and not within(imp.module, "engine.service")
    ]
    assert bad == [], report(bad, "only engine/service/ may import store")


def test_engine_never_imports_streamlit_or_app() -> None:
    bad = [imp for imp in all_imports("engine") if within(imp.target, "streamlit", "app")]
    assert bad == [], report(bad, "engine/ must not import streamlit or app")


def test_store_never_imports_engine_or_app() -> None:  # (a) again, statically: function-local imports too
    bad = [imp for imp in all_imports("store") if within(imp.target, "engine", "app", "streamlit")]
    assert bad == [], report(bad, "store/ must not import engine, app or streamlit")


def test_app_never_imports_the_store_directly() -> None:
    bad = [imp for imp in all_imports("app") if within(imp.target, "store")]
    assert bad == [], report(bad, "app/ reaches the store through engine.service, never directly")


def test_app_takes_the_engine_only_through_its_facade() -> None:
    allowed = ("engine.service.api", "engine.errors")
    bad = [imp for imp in all_imports("app") if within(imp.target, "engine") and not within(imp.target, *allowed)]
    assert bad == [], report(bad, "app/ imports the engine's facade (engine.service.api) and engine.errors, "
                                  "nothing else of the engine")  # fmt: skip


def is_cli_module(target: str) -> bool:
    """Whether dotted `target` is (or is inside) a command-line module of the engine: cli, *_cli, __main__."""
    parts = target.split(".")
    return parts[0] == "engine" and any(p in ("cli", "__main__") or p.endswith("_cli") for p in parts[1:])


def cli_imports(imports: list[Import]) -> list[Import]:
    return [imp for imp in imports if is_cli_module(imp.target)]


def test_the_cli_rule_names_file_and_line() -> None:
    source = (
        "from engine.service.decide.policies import session_policies\n"
        "def f():\n"
        "    from engine.service.cli.policy import run_policy\n"
        "    from engine.service import cli\n"
        "import engine.service.decide.evidence\n"
    )
    found = cli_imports(imports_in(source, Path("app/probe.py"), "app.probe"))
    assert [str(imp) for imp in found] == [
        "app/probe.py:3: app.probe function-local imports engine.service.cli.policy.run_policy",
        "app/probe.py:4: app.probe function-local imports engine.service.cli",
    ]


def test_app_imports_no_cli_module() -> None:
    bad = cli_imports(all_imports("app"))
    assert bad == [], report(bad, "app/ calls the service API (engine.service.*), never a command-line module (*_cli)")


def test_foundation_imports_nothing_of_ours() -> None:
    bad = [imp for imp in all_imports("foundation") if within(imp.target, "store", "engine", "app")]
    assert bad == [], report(bad, "foundation/ is the leaf: it imports none of store, engine, app")


# --- layers inside the engine -----------------------------------------------------------------------

# Each engine package imports only packages of a lower rank (and itself, and the shared engine.errors /
# engine.prompts modules). This covers: core imports none of analysis, service, session; measure none of
# analysis, service, session; analysis neither service nor session; session not service.
ENGINE_RANK = {
    "core": 0, "drafts": 1, "models": 1, "serving": 1, "measure": 2, "analysis": 3,
    "session": 4, "watch": 4,
    "engines": 5, "service": 6,
}  # fmt: skip
ENGINE_SHARED = ("engine.errors", "engine.prompts")  # modules or packages any engine package may use, not layers
# An engine's own package (engine/engines/<name>/) holds the engine and its parts. Its runner and its registry entry
# are the engine, ranked with `engines`; every other module of it (server, client, binaries, options, flags) is a
# part, ranked ENGINE_PART_RANK, so the exports speak an engine's vocabulary (its flags, its config) without
# importing its runner.
ENGINE_PART_RANK = 2
ENGINE_ENTRY = ("runner", "entry")  # the engine itself: its runner, and its registry entry


def engine_package(module: str) -> str | None:
    """The engine package (engine.engines.<name>) dotted `module` belongs to, if any."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[:2] == ["engine", "engines"] and (ROOT / "engine/engines" / parts[2]).is_dir():
        return ".".join(parts[:3])
    return None


def engine_rank(module: str) -> tuple[str, int] | None:
    """(layer, rank) of a dotted engine module: an engine package's parts rank ENGINE_PART_RANK, its runner and
    everything else of a layer that layer's rank; None for shared modules and what is not ours."""
    if within(module, *ENGINE_SHARED) or not module.startswith("engine."):
        return None
    layer = module.split(".")[1]
    if layer not in ENGINE_RANK:
        return None
    package = engine_package(module)
    if package is not None and module.split(".")[3:4] not in [[name] for name in ENGINE_ENTRY]:
        return layer, ENGINE_PART_RANK
    return layer, ENGINE_RANK[layer]


def shared_files(module: str) -> list[Path]:
    """The files of a shared engine module: engine/x.py, or every file of the package engine/x/."""
    path = ROOT / module.replace(".", "/")
    if (path / "__init__.py").is_file():
        return python_files(str(path.relative_to(ROOT)))
    assert path.with_suffix(".py").is_file(), f"{module} is in ENGINE_SHARED but is neither a module nor a package"
    return [path.with_suffix(".py")]


def test_engine_packages_are_the_documented_layers() -> None:
    packages = sorted(
        p.parent.name for p in (ROOT / "engine").glob("*/__init__.py") if f"engine.{p.parent.name}" not in ENGINE_SHARED
    )
    assert packages == sorted(ENGINE_RANK), "a new engine package: rank it here, describe it in docs/architecture.md"


@pytest.mark.parametrize("layer", sorted(ENGINE_RANK, key=lambda name: (ENGINE_RANK[name], name)))
def test_engine_layer_order(layer: str) -> None:
    bad = []
    for imp in all_imports(f"engine/{layer}"):
        source, target = engine_rank(imp.module), engine_rank(imp.target)
        if source is None or target is None:
            continue
        same_layer = source[0] == target[0] and target[1] <= source[1]
        if target[1] >= source[1] and not same_layer:
            bad.append(imp)
    assert bad == [], report(bad, f"engine/{layer} imports only lower ranks ({ENGINE_RANK}; engine parts rank "
                                  f"{ENGINE_PART_RANK})")  # fmt: skip


def test_an_engine_package_imports_no_other_engine_and_its_parts_no_runner() -> None:
    bad = []
    for imp in all_imports("engine/engines"):
        source, target = engine_package(imp.module), engine_package(imp.target)
        if source is not None and target is not None and source != target:
            bad.append(imp)  # llama.cpp's code reaching into vLLM's: shared helpers belong in foundation/processes
        elif (
            source is not None
            and engine_rank(imp.module) == ("engines", ENGINE_PART_RANK)
            and (engine_rank(imp.target) == ("engines", ENGINE_RANK["engines"]))
        ):
            bad.append(imp)  # a part importing a runner or the registry
    assert bad == [], report(bad, "an engine package imports no other engine package, and its parts no runner")


def test_the_exports_reach_engine_parts_not_runners() -> None:
    found = [imp for imp in all_imports("engine/analysis") if engine_package(imp.target)]
    assert found, "the llama.cpp export builds its flags with the engine's own launch module"
    assert all(engine_rank(imp.target) == ("engines", ENGINE_PART_RANK) for imp in found), report(found, "parts only")


def test_engine_shared_modules_import_no_engine_package() -> None:
    bad = [
        imp
        for module in ENGINE_SHARED
        for path in shared_files(module)
        for imp in imports_of(path)
        if within(imp.target, *(f"engine.{n}" for n in ENGINE_RANK))
    ]
    assert bad == [], report(bad, f"{', '.join(ENGINE_SHARED)} sit below every engine package")


def import_graph(top: str) -> dict[str, set[str]]:
    """Module -> the modules of `top` it imports (function-local imports too; a package's own __init__ left out)."""
    modules = {module_name(p) for p in python_files(top)}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in all_imports(top):
        target = imp.target
        while target and target not in modules:  # `from a.b import name` names module a.b
            target = target.rpartition(".")[0]
        if target and target != imp.module and not imp.module.startswith(target + "."):
            graph[imp.module].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, round a circle (strongly connected, more than one)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            group = []
            while True:
                other = stack.pop()
                group.append(other)
                if other == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return found


def test_no_engine_modules_import_each_other_round_a_circle() -> None:
    found = circles(import_graph("engine"))
    assert found == [], "engine modules that import each other round a circle:\n  " + "\n  ".join(map(str, found))


def test_the_circle_check_sees_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]] and circles({"a": {"b"}, "b": set()}) == []


# --- (f) every engine package says in one line what it is -------------------------------------------


def test_every_engine_package_has_a_one_line_docstring() -> None:
    bad = []
    for init in sorted((ROOT / "engine").rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        if not doc or "\n" in doc.strip():
            bad.append(f"{init.relative_to(ROOT)}: {'no docstring' if not doc else 'docstring is not one line'}")
    assert bad == [], "every engine package needs a one-line docstring:\n  " + "\n  ".join(bad)


# --- (g) no hidden cycles inside the store ---------------------------------------------------------------


def test_store_has_no_function_local_imports_of_itself() -> None:
    bad = [imp for imp in all_imports("store") if imp.local and within(imp.target, "store")]
    assert bad == [], report(bad, "store/ imports its own modules at module level (a local import hides a cycle)")
