"""The engine seam's rules, checked mechanically: an engine is chosen by name only in the registry.

The engine is made of modules and functions a reader can hold (docs/architecture.md, "The engine seam")."""

from __future__ import annotations

import ast
from pathlib import Path

from engine.engines import registry

ROOT = Path(__file__).resolve().parents[1]
# where an engine-like word names something else: a running deployment's server software (engine/serving, and the
# endpoint engine's requests and stand-in, whose bodies and routes differ by server); and the registry itself
NOT_SESSION_ENGINES = ("engine/serving/", "engine/engines/endpoint/", "engine/engines/registry.py")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
LONG_ALLOWED = {"engine/core/decoder.py:decode_prompt"}  # the decode loop, readable in one sitting (gpt-fast style)


def sources(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def engine_names() -> set[str]:
    return {spelling for name in registry.names() for spelling in (name, registry.get(name).cli)}


def name_checks(path: Path, names: set[str], where: str | None = None) -> list[str]:
    """`x == "llama.cpp"`, `x != "spectune"`, `x in ("llamacpp", …)`: a comparison with an engine's name."""
    found = []
    where = where or rel(path)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        for part in [node.left, *node.comparators]:
            values = part.elts if isinstance(part, ast.Tuple | ast.List | ast.Set) else [part]
            if any(isinstance(v, ast.Constant) and v.value in names for v in values):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
                break
    return found


def test_no_engine_is_chosen_by_name_outside_the_registry() -> None:
    names = engine_names()
    assert {"spectune", "llama.cpp", "llamacpp"} <= names
    bad = [hit for path in sources("engine", "app") if not rel(path).startswith(NOT_SESSION_ENGINES)
           for hit in name_checks(path, names)]  # fmt: skip
    assert bad == [], "choose engines through engine/engines/registry.py:\n  " + "\n  ".join(bad)


def test_the_check_sees_a_comparison_with_an_engine_name(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text('def f(spec):\n    return spec.engine == "llama.cpp" or spec.engine in ("spectune",)\n')
    assert len(name_checks(probe, engine_names(), "probe.py")) == 2


def test_engine_modules_and_functions_are_sizes_a_reader_can_hold() -> None:
    big, long = [], []
    for path in sources("engine"):
        text = path.read_text(encoding="utf-8")
        if (n := len(text.splitlines())) > MAX_MODULE_LINES:
            big.append(f"{rel(path)}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                where = f"{rel(path)}:{node.name}"
                if n > MAX_FUNCTION_LINES and where not in LONG_ALLOWED:
                    long.append(f"{where}: {n} lines")
    assert big == [], f"engine modules over {MAX_MODULE_LINES} lines:\n  " + "\n  ".join(big)
    assert long == [], f"engine functions over {MAX_FUNCTION_LINES} lines:\n  " + "\n  ".join(long)
