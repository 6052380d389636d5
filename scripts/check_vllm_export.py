#!/usr/bin/env python3
"""Validate a spectune-exported vLLM speculative config against vLLM's own source.

Usage (run it WITH the check environment's python, the one `make check-env` installed the
pinned vLLM into with ``pip install --no-deps``):

    .venv-check/bin/python scripts/check_vllm_export.py EXPORT.json     # or '-' for stdin
    .venv-check/bin/python scripts/check_vllm_export.py --schema        # dump fields/types/methods
    .venv-check/bin/python scripts/check_vllm_export.py --vllm-root DIR EXPORT.json
                                   # DIR = a folder holding an unpacked 'vllm/' package

Exit 0 when every key is a ``SpeculativeConfig`` field, every value has a
type compatible with the field's annotation (and its pydantic ``Field``
bounds), ``method`` is one of the allowed literals, and the engine-free
semantic checks of ``__post_init__``/``_verify_args`` pass.  Exit 1 with one
line per problem otherwise; exit 2 on usage/environment errors.

How it works: vLLM cannot be imported here (``vllm/__init__`` imports torch,
and ``vllm.config`` pulls transformers, pydantic and ~40 other packages), so
this script never imports vllm.  It finds the installed package with
``importlib.util.find_spec('vllm')`` (which does not execute the package) and
reads ``vllm/config/speculative.py`` -- and whatever modules its annotations
refer to -- with ``ast``.  The only vLLM code it executes is
``vllm/v1/spec_decode/dynamic/utils.py`` (no imports at all), vLLM's own
validator for ``num_speculative_tokens_per_batch_size``.

The JSON is what a user pastes into ``vllm serve --speculative-config '<json>'``
(argparse type ``optional_type(json.loads)`` in vllm/engine/arg_utils.py; the
resulting dict is splatted into ``SpeculativeConfig(**d)``, with '-' in keys
replaced by '_').  A top-level ``{"speculative_config": {...}}`` wrapper is
unwrapped (other keys beside it are ignored; a null inner value means "off"
and passes).

Type checking is deliberately a bit stricter than pydantic's lax mode: JSON
strings are not accepted for numbers and bools are not accepted for ints.
Cross-checked once against vLLM 0.33.0's real ``SpeculativeConfig(**json)``
(vLLM imported with torch and its dependencies): the verdicts agreed on 20 of
22 configs; the two differences are that strictness (a JSON string for an
int) and the engine-internal ``target_model_config``, which vLLM overwrites.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

# ---------------------------------------------------------------------------
# Locating the package
# ---------------------------------------------------------------------------


def die(msg: str) -> None:
    print(msg, file=sys.stderr)
    raise SystemExit(2)


def find_vllm_root(explicit: str | None) -> str:
    """Return the directory of the 'vllm' package (the one holding __init__.py)."""
    if explicit:
        cand = os.path.join(explicit, "vllm")
        if os.path.isfile(os.path.join(cand, "__init__.py")):
            return cand
        if os.path.isfile(os.path.join(explicit, "__init__.py")):
            return explicit
        die(f"error: no vllm package under {explicit}")
    spec = importlib.util.find_spec("vllm")  # locates, does not import
    if spec is None or not spec.submodule_search_locations:
        die(
            "error: vllm is not installed for this interpreter "
            f"({sys.executable}). Run this script with the check venv's python "
            "(.venv-check/bin/python, made by `make check-env`)."
        )
    return list(spec.submodule_search_locations)[0]


def vllm_version(root: str) -> str:
    try:
        for entry in os.listdir(os.path.dirname(root)):  # site-packages/vllm-X.dist-info
            if entry.startswith("vllm-") and entry.endswith(".dist-info"):
                return entry[len("vllm-") : -len(".dist-info")]
    except OSError:
        pass
    vfile = os.path.join(root, "_version.py")
    if os.path.isfile(vfile):
        for node in ast.parse(open(vfile).read()).body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id in ("__version__", "version") for t in node.targets
            ):
                try:
                    return str(ast.literal_eval(node.value))
                except Exception:
                    pass
    return "unknown"


# ---------------------------------------------------------------------------
# A tiny static type model built from annotations
# ---------------------------------------------------------------------------


@dataclass
class T:
    kind: str  # any none int float bool str literal list tuple dict union enum config opaque internal
    args: list = field(default_factory=list)  # sub-types
    values: list = field(default_factory=list)  # literal values / enum member names
    name: str = ""  # class name for enum/config/opaque
    ellipsis: bool = False  # tuple[X, ...]
    fields: dict | None = None  # config class fields (lazy)

    def show(self) -> str:
        k = self.kind
        if k in ("any", "int", "float", "bool", "str"):
            return k
        if k == "none":
            return "None"
        if k == "literal":
            return "Literal[" + ", ".join(repr(v) for v in self.values) + "]"
        if k == "list":
            return f"list[{self.args[0].show()}]"
        if k == "tuple":
            inner = ", ".join(a.show() for a in self.args)
            return f"tuple[{inner}, ...]" if self.ellipsis else f"tuple[{inner}]"
        if k == "dict":
            return f"dict[{self.args[0].show()}, {self.args[1].show()}]"
        if k == "union":
            return " | ".join(a.show() for a in self.args)
        if k == "enum":
            return f"{self.name}(enum)"
        if k == "config":
            return f"{self.name}(config dict)"
        if k == "internal":
            return f"SkipValidation[{self.name}] (engine-internal)"
        return self.name or k


ANY = T("any")
BUILTIN = {
    "int": T("int"),
    "float": T("float"),
    "bool": T("bool"),
    "str": T("str"),
    "bytes": T("str"),
    "Any": ANY,
    "object": ANY,
    "None": T("none"),
}
TYPING_GENERIC = {
    "list": "list",
    "List": "list",
    "Sequence": "list",
    "set": "list",
    "Set": "list",
    "tuple": "tuple",
    "Tuple": "tuple",
    "dict": "dict",
    "Dict": "dict",
    "Mapping": "dict",
    "MutableMapping": "dict",
}
ENUM_BASES = {"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"}


class SourceIndex:
    """Parses modules of the vllm package on demand and resolves names."""

    def __init__(self, pkg_root: str):
        self.pkg_root = pkg_root  # .../vllm
        self.base = os.path.dirname(pkg_root)
        self._trees: dict[str, ast.Module | None] = {}
        self._bindings: dict[str, dict[str, tuple]] = {}
        self._class_cache: dict[tuple[str, str], T] = {}
        self._resolving: set = set()

    # -- files ---------------------------------------------------------------
    def module_file(self, mod: str) -> str | None:
        if not (mod == "vllm" or mod.startswith("vllm.")):
            return None
        rel = mod.replace(".", os.sep)
        for cand in (
            os.path.join(self.base, rel + ".py"),
            os.path.join(self.base, rel, "__init__.py"),
        ):
            if os.path.isfile(cand):
                return cand
        return None

    def tree(self, mod: str) -> ast.Module | None:
        if mod not in self._trees:
            path = self.module_file(mod)
            self._trees[mod] = ast.parse(open(path, encoding="utf-8").read(), path) if path else None
        return self._trees[mod]

    # -- bindings ------------------------------------------------------------
    def bindings(self, mod: str) -> dict[str, tuple]:
        if mod in self._bindings:
            return self._bindings[mod]
        out: dict[str, tuple] = {}
        tree = self.tree(mod)
        is_pkg = (self.module_file(mod) or "").endswith("__init__.py")

        def absmod(node: ast.ImportFrom) -> str:
            if not node.level:
                return node.module or ""
            parts = mod.split(".")
            if not is_pkg:
                parts = parts[:-1]
            parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
            return ".".join(parts + ([node.module] if node.module else []))

        def walk(stmts):
            for st in stmts:
                if isinstance(st, ast.If):
                    test = ast.unparse(st.test)
                    if test in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                        walk(st.orelse)  # runtime branch is what pydantic sees
                    else:
                        walk(st.body)
                        walk(st.orelse)
                elif isinstance(st, ast.Try):
                    walk(st.body)
                elif isinstance(st, ast.ImportFrom):
                    src = absmod(st)
                    for a in st.names:
                        out[a.asname or a.name] = ("from", src, a.name)
                elif isinstance(st, ast.Import):
                    for a in st.names:
                        if a.asname:
                            out[a.asname] = ("module", a.name)
                        else:
                            out[a.name.split(".")[0]] = ("module", a.name.split(".")[0])
                elif isinstance(st, ast.ClassDef):
                    out[st.name] = ("class", mod, st)
                elif isinstance(st, (ast.Assign, ast.AnnAssign)):
                    targets = st.targets if isinstance(st, ast.Assign) else [st.target]
                    val = st.value
                    if val is None:
                        continue
                    for t in targets:
                        if isinstance(t, ast.Name):
                            if (
                                isinstance(val, ast.Call)
                                and isinstance(val.func, ast.Name)
                                and val.func.id == "LazyLoader"
                                and len(val.args) >= 3
                                and isinstance(val.args[2], ast.Constant)
                            ):
                                out[t.id] = ("module", val.args[2].value)
                            else:
                                out[t.id] = ("alias", mod, val)

        if tree is not None:
            walk(tree.body)
        self._bindings[mod] = out
        return out

    # -- evaluation of annotation expressions --------------------------------
    def resolve_name(self, mod: str, name: str, depth: int = 0) -> T | tuple:
        """Return a T, or ('typing', name) for typing constructs, or ('module', m)."""
        if depth > 25:
            return ANY
        b = self.bindings(mod).get(name)
        if b is None:
            if name in BUILTIN:
                return BUILTIN[name]
            if name in TYPING_GENERIC:
                return ("typing", name)
            return T("opaque", name=name)
        kind = b[0]
        if kind == "from":
            src, orig = b[1], b[2]
            if src.startswith("vllm"):
                sub = f"{src}.{orig}"
                if self.module_file(sub) and orig not in self.bindings(src):
                    return ("module", sub)
                return self.resolve_name(src, orig, depth + 1)
            # external: typing / pydantic / collections.abc / torch ...
            if orig in BUILTIN:
                return BUILTIN[orig]
            return ("typing", orig)
        if kind == "module":
            return ("module", b[1])
        if kind == "class":
            return self.class_type(b[1], b[2])
        if kind == "alias":
            key = (b[1], name)
            if key in self._resolving:
                return ANY
            self._resolving.add(key)
            try:
                return self.eval(b[1], b[2], depth + 1)
            finally:
                self._resolving.discard(key)
        return ANY

    def class_type(self, mod: str, cls: ast.ClassDef) -> T:
        key = (mod, cls.name)
        if key in self._class_cache:
            return self._class_cache[key]
        bases = {ast.unparse(b).split(".")[-1] for b in cls.bases}
        decos = {ast.unparse(d).split("(")[0].split(".")[-1] for d in cls.decorator_list}
        if bases & ENUM_BASES:
            members = []
            for st in cls.body:
                if isinstance(st, ast.Assign):
                    for t in st.targets:
                        if isinstance(t, ast.Name) and not t.id.startswith("_"):
                            members.append(t.id)
            res = T("enum", name=cls.name, values=members)
        elif decos & {"config", "dataclass"}:
            res = T("config", name=cls.name)
            res.fields = None  # filled lazily by class_fields()
            res.values = [mod]  # remember where it lives
        else:
            res = T("opaque", name=cls.name)
        self._class_cache[key] = res
        return res

    def eval(self, mod: str, node: ast.AST, depth: int = 0):
        if depth > 40:
            return ANY
        if isinstance(node, ast.Constant):
            if node.value is None:
                return T("none")
            if isinstance(node.value, str):  # forward reference
                try:
                    return self.eval(mod, ast.parse(node.value, mode="eval").body, depth + 1)
                except SyntaxError:
                    return ANY
            if node.value is Ellipsis:
                return ("ellipsis",)
            return ANY
        if isinstance(node, ast.Name):
            return self.resolve_name(mod, node.id, depth)
        if isinstance(node, ast.Attribute):
            base = self.eval(mod, node.value, depth + 1)
            if isinstance(base, tuple) and base[0] == "module":
                if base[1].startswith("vllm"):
                    return self.resolve_name(base[1], node.attr, depth + 1)
                if node.attr in BUILTIN:
                    return BUILTIN[node.attr]
                return ("typing", node.attr)
            return T("opaque", name=ast.unparse(node))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self.union(
                [
                    self.as_type(self.eval(mod, node.left, depth + 1)),
                    self.as_type(self.eval(mod, node.right, depth + 1)),
                ]
            )
        if isinstance(node, ast.Subscript):
            head = self.eval(mod, node.value, depth + 1)
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            hname = head[1] if isinstance(head, tuple) and head[0] == "typing" else None
            if hname is None and isinstance(head, T) and head.kind == "opaque":
                hname = head.name.split(".")[-1]
            if hname == "Literal":
                vals: list = []
                for it in items:
                    if isinstance(it, ast.Constant):
                        vals.append(it.value)
                    else:
                        sub = self.as_type(self.eval(mod, it, depth + 1))
                        if sub.kind == "literal":
                            vals.extend(sub.values)
                return T("literal", values=vals)
            if hname == "Optional":
                return self.union([self.as_type(self.eval(mod, items[0], depth + 1)), T("none")])
            if hname == "Union":
                return self.union([self.as_type(self.eval(mod, i, depth + 1)) for i in items])
            if hname in ("Annotated", "Required", "NotRequired", "Final", "ClassVar"):
                inner = self.as_type(self.eval(mod, items[0], depth + 1))
                if hname == "ClassVar":
                    return T("classvar", args=[inner])
                return inner
            if hname == "SkipValidation":
                inner = self.as_type(self.eval(mod, items[0], depth + 1))
                return T("internal", args=[inner], name=inner.show())
            g = TYPING_GENERIC.get(hname or "")
            if g == "list":
                return T("list", args=[self.as_type(self.eval(mod, items[0], depth + 1))])
            if g == "dict":
                k = self.as_type(self.eval(mod, items[0], depth + 1))
                v = self.as_type(self.eval(mod, items[1], depth + 1)) if len(items) > 1 else ANY
                return T("dict", args=[k, v])
            if g == "tuple":
                subs = [self.eval(mod, i, depth + 1) for i in items]
                if len(subs) == 2 and subs[1] == ("ellipsis",):
                    return T("tuple", args=[self.as_type(subs[0])], ellipsis=True)
                return T("tuple", args=[self.as_type(s) for s in subs])
            if hname in ("Callable", "type", "Type"):
                return T("opaque", name=hname)
            return self.as_type(head)
        return ANY

    def as_type(self, x) -> T:
        if isinstance(x, T):
            return x
        if isinstance(x, tuple) and x[0] == "typing":
            if x[1] in TYPING_GENERIC:
                g = TYPING_GENERIC[x[1]]
                return T(
                    g, args=[ANY] if g == "list" else ([ANY, ANY] if g == "dict" else [ANY]), ellipsis=(g == "tuple")
                )
            if x[1] in ("Any", "TypeAlias"):
                return ANY
            return T("opaque", name=x[1])
        return ANY

    @staticmethod
    def union(parts: list[T]) -> T:
        flat: list[T] = []
        for p in parts:
            flat.extend(p.args if p.kind == "union" else [p])
        return T("union", args=flat) if len(flat) > 1 else flat[0]

    # -- dataclass fields ----------------------------------------------------
    def class_fields(self, mod: str, cls: ast.ClassDef) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for st in cls.body:
            if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
                continue
            name = st.target.id
            typ = self.as_type(self.eval(mod, st.annotation))
            if typ.kind == "classvar":
                continue
            info: dict[str, Any] = {
                "type": typ,
                "bounds": {},
                "has_default": st.value is not None,
                "default": None,
                "line": st.lineno,
            }
            val = st.value
            if isinstance(val, ast.Call) and ast.unparse(val.func).split(".")[-1] == "Field":
                for kw in val.keywords:
                    if kw.arg in ("gt", "ge", "lt", "le", "min_length", "max_length"):
                        try:
                            info["bounds"][kw.arg] = ast.literal_eval(kw.value)
                        except Exception:
                            pass
                    if kw.arg == "default":
                        try:
                            info["default"] = ast.literal_eval(kw.value)
                        except Exception:
                            info["default"] = ast.unparse(kw.value)
                    if kw.arg == "default_factory":
                        info["default"] = f"<factory {ast.unparse(kw.value)}>"
            elif val is not None:
                try:
                    info["default"] = ast.literal_eval(val)
                except Exception:
                    info["default"] = ast.unparse(val)
            out[name] = info
        return out

    def config_fields(self, t: T) -> dict[str, dict]:
        if t.fields is None:
            mod = t.values[0]
            b = self.bindings(mod).get(t.name)
            t.fields = self.class_fields(mod, b[2]) if b and b[0] == "class" else {}
        return t.fields


# ---------------------------------------------------------------------------
# Value checking
# ---------------------------------------------------------------------------


def check_value(idx: SourceIndex, v: Any, t: T, path: str, lenient_enum: bool = False) -> str | None:
    """Return None when v is acceptable for t, else a reason."""
    k = t.kind
    if k == "any":
        return None
    if k == "none":
        return None if v is None else f"expected null, got {json.dumps(v)}"
    if k == "bool":
        return None if isinstance(v, bool) else f"expected bool, got {json.dumps(v)}"
    if k == "int":
        return None if isinstance(v, int) and not isinstance(v, bool) else f"expected int, got {json.dumps(v)}"
    if k == "float":
        return (
            None if isinstance(v, (int, float)) and not isinstance(v, bool) else f"expected number, got {json.dumps(v)}"
        )
    if k == "str":
        return None if isinstance(v, str) else f"expected string, got {json.dumps(v)}"
    if k == "literal":
        if v in t.values and type(v) in {type(x) for x in t.values}:
            return None
        return f"{json.dumps(v)} is not an allowed value; allowed: {', '.join(map(str, t.values))}"
    if k == "list":
        if not isinstance(v, list):
            return f"expected list, got {json.dumps(v)}"
        for i, item in enumerate(v):
            r = check_value(idx, item, t.args[0], f"{path}[{i}]", lenient_enum)
            if r:
                return f"[{i}]: {r}"
        return None
    if k == "tuple":
        if not isinstance(v, list):
            return f"expected array (tuple), got {json.dumps(v)}"
        if t.ellipsis:
            subs = [t.args[0]] * len(v)
        else:
            if len(v) != len(t.args):
                return f"expected array of {len(t.args)} items ({t.show()}), got {len(v)}: {json.dumps(v)}"
            subs = t.args
        for i, (item, st) in enumerate(zip(v, subs, strict=True)):
            r = check_value(idx, item, st, f"{path}[{i}]", lenient_enum)
            if r:
                return f"[{i}]: {r}"
        return None
    if k == "dict":
        if not isinstance(v, dict):
            return f"expected object, got {json.dumps(v)}"
        for kk, vv in v.items():
            r = check_value(idx, vv, t.args[1], f"{path}.{kk}", lenient_enum)
            if r:
                return f"[{kk!r}]: {r}"
        return None
    if k == "union":
        reasons = []
        for alt in t.args:
            r = check_value(idx, v, alt, path, lenient_enum)
            if r is None:
                return None
            if alt.kind != "none":
                reasons.append(r)
        if len(reasons) == 1:  # the usual `X | None`: say why X failed
            return reasons[0]
        return f"{json.dumps(v)} matches none of {t.show()}"
    if k == "enum":
        if isinstance(v, str):
            names = t.values
            if v in names or (lenient_enum and (v.upper() in names or v.lower() == "auto")):
                return None
        return f"{json.dumps(v)} is not a member of {t.name}: {t.values}"
    if k == "config":
        if not isinstance(v, dict):
            return f"expected object for {t.name}, got {json.dumps(v)}"
        fields = idx.config_fields(t)
        for kk, vv in v.items():
            if kk not in fields:
                return f"unknown {t.name} field {kk!r}"
            r = check_value(idx, vv, fields[kk]["type"], f"{path}.{kk}", lenient_enum)
            if r:
                return f".{kk}: {r}"
        return None
    if k == "internal":
        return f"engine-internal field ({t.name}); set by vLLM, not user-settable"
    # opaque classes: only JSON null can be checked
    return f"cannot be given as JSON (type {t.show()})"


def check_bounds(v: Any, bounds: dict) -> str | None:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    for op, lim in bounds.items():
        bad = {
            "gt": not v > lim,
            "ge": not v >= lim,
            "lt": not v < lim,
            "le": not v <= lim,
        }.get(op, False)
        if bad:
            return f"must be {op} {lim} (pydantic Field), got {v}"
    return None


# ---------------------------------------------------------------------------
# Extra facts read from other vLLM files
# ---------------------------------------------------------------------------


def field_validators(cls: ast.ClassDef) -> set[str]:
    names = set()
    for st in cls.body:
        if isinstance(st, ast.FunctionDef):
            for d in st.decorator_list:
                if isinstance(d, ast.Call) and ast.unparse(d.func).endswith("field_validator"):
                    for a in d.args:
                        if isinstance(a, ast.Constant) and isinstance(a.value, str):
                            names.add(a.value)
    return names


def v1_dynamic_sd_methods(idx: SourceIndex) -> list[str] | None:
    """Methods for which V1 keeps num_speculative_tokens_per_batch_size
    (VllmConfig._maybe_disable_dynamic_sd_for_v1 in vllm/config/vllm.py)."""
    tree = idx.tree("vllm.config.vllm")
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "_maybe_disable_dynamic_sd_for_v1":
            for sub in ast.walk(node):
                if (
                    isinstance(sub, ast.Compare)
                    and ast.unparse(sub.left).endswith(".method")
                    and isinstance(sub.ops[0], ast.In)
                    and isinstance(sub.comparators[0], (ast.Tuple, ast.List, ast.Set))
                ):
                    return [e.value for e in sub.comparators[0].elts if isinstance(e, ast.Constant)]
    return None


def load_dynamic_sd_validator(pkg_root: str):
    """Load vLLM's own schedule validator without importing the vllm package."""
    path = os.path.join(pkg_root, "v1", "spec_decode", "dynamic", "utils.py")
    if not os.path.isfile(path):
        return None
    spec = importlib.util.spec_from_file_location("_vllm_dynamic_sd_utils", path)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)  # stdlib-only file
    except ImportError:
        return None
    return getattr(mod, "validate_and_normalize_dynamic_sd_schedule", None)


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def method_bounds(cls: ast.ClassDef, name: str) -> dict[str, tuple[Any, Any]]:
    """field -> (lowest, highest) allowed, read from a validator method's ``if self.F < N: raise`` and
    ``if not A <= self.F <= B: raise`` tests (vLLM's _validate_suffix_decoding); None where a side is open."""
    fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    bounds: dict[str, tuple[Any, Any]] = {}
    for node in ast.walk(fn) if fn is not None else ():
        if not isinstance(node, ast.If) or not any(isinstance(b, ast.Raise) for b in node.body):
            continue
        test = node.test
        if (
            isinstance(test, ast.Compare)
            and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Lt)
            and isinstance(test.left, ast.Attribute)
            and isinstance(test.comparators[0], ast.Constant)
        ):
            bounds[test.left.attr] = (test.comparators[0].value, None)
        elif (
            isinstance(test, ast.UnaryOp)
            and isinstance(test.op, ast.Not)
            and isinstance(test.operand, ast.Compare)
            and [type(o) for o in test.operand.ops] == [ast.LtE, ast.LtE]
        ):
            cmp = test.operand
            lo, (mid, hi) = cmp.left, cmp.comparators
            if isinstance(lo, ast.Constant) and isinstance(mid, ast.Attribute) and isinstance(hi, ast.Constant):
                bounds[mid.attr] = (lo.value, hi.value)
    return bounds


class Schema:
    def __init__(self, pkg_root: str):
        self.pkg_root = pkg_root
        self.idx = SourceIndex(pkg_root)
        mod = "vllm.config.speculative"
        tree = self.idx.tree(mod)
        if tree is None:
            die(f"error: {pkg_root}/config/speculative.py not found (vLLM too old?)")
        cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeConfig"), None)
        if cls is None:
            die("error: class SpeculativeConfig not found in vllm/config/speculative.py")
        self.cls = cls
        self.fields = self.idx.class_fields(mod, cls)
        self.validated = field_validators(cls)
        mt = self.fields.get("method", {}).get("type")
        alts = ([mt] if mt.kind != "union" else mt.args) if mt else []
        self.methods = list(dict.fromkeys(v for a in alts if a.kind == "literal" for v in a.values))
        mtp = self.idx.resolve_name(mod, "MTPModelTypes")
        self.mtp_aliases = [
            m for m in (mtp.values if isinstance(mtp, T) and mtp.kind == "literal" else []) if m != "mtp"
        ]
        self.dynamic_v1_methods = v1_dynamic_sd_methods(self.idx)
        self.suffix_bounds = method_bounds(cls, "_validate_suffix_decoding")
        self.schedule_validator = load_dynamic_sd_validator(pkg_root)
        self.version = vllm_version(pkg_root)

    def as_json(self) -> dict:
        return {
            "vllm_version": self.version,
            "source": os.path.join(self.pkg_root, "config", "speculative.py"),
            "methods": self.methods,
            "deprecated_method_aliases_to_mtp": self.mtp_aliases,
            "dynamic_sd_methods_supported_on_v1_runner": self.dynamic_v1_methods,
            "fields": {
                n: {
                    "type": f["type"].show(),
                    "default": f["default"]
                    if isinstance(f["default"], (int, float, str, bool, type(None), list))
                    else str(f["default"]),
                    **({"bounds": f["bounds"]} if f["bounds"] else {}),
                }
                for n, f in self.fields.items()
            },
        }

    def check(self, cfg: dict) -> tuple[list[str], list[str]]:
        errors: list[str] = []
        warnings: list[str] = []
        # EngineArgs.create_speculative_config: keys have '-' replaced by '_'
        norm = {}
        for k, v in cfg.items():
            nk = k.replace("-", "_")
            if nk != k:
                warnings.append(f"key {k!r} is accepted as {nk!r} (vLLM replaces '-' with '_')")
            norm[nk] = v
        for k, v in norm.items():
            f = self.fields.get(k)
            if f is None:
                errors.append(f"{k}: not a SpeculativeConfig field (pydantic extra='forbid' rejects it)")
                continue
            t = f["type"]
            if t.kind == "internal":
                errors.append(f"{k}: engine-internal field ({t.name}); not user-settable")
                continue
            r = check_value(self.idx, v, t, k, lenient_enum=k in self.validated)
            if r:
                errors.append(
                    f"{k}: {r}"
                    + ("" if t.kind in ("literal", "union") and "allowed" in r else f" (annotation: {t.show()})")
                )
                continue
            r = check_bounds(v, f["bounds"])
            if r:
                errors.append(f"{k}: {r}")

        # --- engine-free semantic checks mirrored from __post_init__/_verify_args
        method = norm.get("method")
        model = norm.get("model")
        if method in self.mtp_aliases:
            warnings.append(f"method {method!r} is deprecated; vLLM rewrites it to 'mtp'")
        if "tensor_parallel_size" in norm and norm["tensor_parallel_size"] is not None:
            errors.append("tensor_parallel_size: rejected by _verify_args; use draft_tensor_parallel_size")
        eff_method = method or ("ngram" if model in ("ngram", "[ngram]") else ("draft_model" if model else None))
        if method is None and model is None:
            errors.append(
                "neither 'method' nor 'model' given: vLLM would default to "
                "method='draft_model' and fail without a draft model"
            )
        if model is None and method in ("draft_model", "eagle", "eagle3", "dflash"):
            errors.append(
                f"method={method!r} needs 'model' (the draft/head checkpoint); "
                "__post_init__ raises 'num_speculative_tokens was provided but without speculative model'"
            )
        if norm.get("num_speculative_tokens") is None:
            msg = (
                "num_speculative_tokens missing: _verify_args raises unless the draft "
                "checkpoint's config supplies n_predict"
            )
            if eff_method in ("ngram", "ngram_gpu", "suffix", "draft_model", "custom_class"):
                errors.append(msg)
            else:
                warnings.append(msg)
        if eff_method in ("ngram", "ngram_gpu"):
            lo, hi = norm.get("prompt_lookup_min"), norm.get("prompt_lookup_max")
            if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
                errors.append(f"prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}")
        if eff_method == "suffix":
            errors += suffix_problems(norm, self.suffix_bounds)
            warnings.append("method 'suffix' needs Arctic Inference beside vLLM (pip install arctic-inference)")
        syn = norm.get("synthetic_acceptance_rates") is not None or norm.get("synthetic_acceptance_length") is not None
        if syn and norm.get("rejection_sample_method", "standard") != "synthetic":
            errors.append("synthetic_acceptance_* are only valid with rejection_sample_method='synthetic'")

        sched = norm.get("num_speculative_tokens_per_batch_size")
        if (
            "num_speculative_tokens_per_batch_size" in norm
            and "num_speculative_tokens_per_batch_size" not in self.fields
        ):
            pass  # already reported as unknown field (vLLM < 0.24)
        elif sched is not None and not any(e.startswith("num_speculative_tokens_per_batch_size:") for e in errors):
            if self.schedule_validator is not None:
                try:
                    parsed = self.schedule_validator(sched)
                except (ValueError, TypeError) as e:
                    errors.append(f"num_speculative_tokens_per_batch_size: {e} (vllm/v1/spec_decode/dynamic/utils.py)")
                else:
                    k = norm.get("num_speculative_tokens")
                    if isinstance(k, int) and any(n > k for _, _, n in parsed):
                        warnings.append(
                            "num_speculative_tokens_per_batch_size: entries above "
                            f"num_speculative_tokens={k} are clamped to it"
                        )
            else:
                warnings.append(
                    "num_speculative_tokens_per_batch_size: vLLM's schedule validator "
                    "not found; only the type was checked"
                )
            if self.dynamic_v1_methods is not None and eff_method not in self.dynamic_v1_methods:
                warnings.append(
                    f"num_speculative_tokens_per_batch_size with method={eff_method!r}: vLLM drops the "
                    f"schedule on Model Runner V1 (kept only for {self.dynamic_v1_methods}; "
                    "V2 runner keeps it)"
                )
            warnings.append("num_speculative_tokens_per_batch_size is dropped when data_parallel_size > 1")
        return errors, warnings


def suffix_problems(norm: dict, bounds: dict[str, tuple[Any, Any]]) -> list[str]:
    """The suffix_decoding_* values outside what vLLM's _validate_suffix_decoding allows."""
    if not bounds:
        return ["method 'suffix': vLLM's _validate_suffix_decoding not found; its bounds were not checked"]
    out = []
    for name, (lo, hi) in sorted(bounds.items()):
        v = norm.get(name)
        if isinstance(v, int | float) and not isinstance(v, bool):
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                out.append(
                    f"{name}={v}: _validate_suffix_decoding needs {lo if lo is not None else '-inf'} <= "
                    f"{name}{f' <= {hi}' if hi is not None else ''}"
                )
    return out


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export", nargs="?", help="exported speculative-config JSON file, or '-' for stdin")
    ap.add_argument("--vllm-root", help="folder containing an unpacked vllm/ package (default: find_spec)")
    ap.add_argument("--schema", action="store_true", help="print the extracted schema as JSON and exit")
    ap.add_argument("-q", "--quiet", action="store_true", help="no warnings on success")
    a = ap.parse_args(argv)

    schema = Schema(find_vllm_root(a.vllm_root))
    if a.schema:
        print(json.dumps(schema.as_json(), indent=2, default=str))
        return 0
    if not a.export:
        ap.error("EXPORT.json is required (or --schema)")
    try:
        raw = sys.stdin.read() if a.export == "-" else open(a.export, encoding="utf-8").read()
        cfg = json.loads(raw)
    except (OSError, json.JSONDecodeError) as e:
        print(f"FAIL: cannot read JSON from {a.export}: {e}", file=sys.stderr)
        return 1
    if isinstance(cfg, dict) and "speculative_config" in cfg:
        # spectune's export: the engine header around the config (null when speculation is off):
        # {"speculative_config": null, "reason": ..., "note": "Launch vLLM without --speculative-config."}
        cfg = cfg["speculative_config"]
        if cfg is None:
            print(
                f"OK: {a.export}: speculative_config is null (speculative decoding off; "
                "launch vLLM without --speculative-config)"
            )
            return 0
    if not isinstance(cfg, dict):
        print("FAIL: the speculative config must be a JSON object", file=sys.stderr)
        return 1
    errors, warnings = schema.check(cfg)
    where = f"vllm {schema.version} SpeculativeConfig ({schema.pkg_root}/config/speculative.py)"
    if errors:
        print(f"FAIL: {a.export} is not a valid {where}:", file=sys.stderr)
        for e in errors:
            print(f"  - {e}", file=sys.stderr)
        for w in warnings:
            print(f"  (warning) {w}", file=sys.stderr)
        return 1
    print(f"OK: {a.export} is a valid {where}")
    if not a.quiet:
        for w in warnings:
            print(f"  (warning) {w}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
