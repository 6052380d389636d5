#!/usr/bin/env python3
"""Check spectune-exported SGLang speculative flags with SGLang's own CLI code.

Usage (run it WITH the check environment's python, where `make check-env` installed the pinned
sglang with ``pip install --no-deps`` plus ``msgspec``):

    .venv-check/bin/python scripts/check_sglang_export.py -- --speculative-algorithm STANDALONE \\
        --speculative-draft-model-path Qwen/Qwen2.5-Coder-0.5B-Instruct \\
        --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
    .venv-check/bin/python scripts/check_sglang_export.py --flags-file FLAGS.txt   # shell-quoted flags
    .venv-check/bin/python scripts/check_sglang_export.py --list                   # flags + choices

Exit 0 when SGLang's parser accepts every flag and value (types and
``choices``) and the engine-free semantic checks pass; exit 1 with the
parser's own message otherwise; exit 2 on environment errors.

How it works.  ``import sglang.srt.server_args`` needs torch and triton
(sglang/__init__ -> sglang.srt.utils.common imports both), so it is not
imported.  Instead:

* The package is located with ``importlib.util.find_spec('sglang')`` and a
  bare package object is registered as ``sys.modules['sglang']`` so that the
  top-level ``sglang/__init__.py`` (env setup, HF patches, frontend API) is not
  executed.  No SGLang function is replaced.
* Every speculative flag is registered exactly as ``ServerArgs.add_cli_args``
  registers it: SGLang's own ``add_cli_args_from_dataclass(parser, Spec)`` on
  the ``Spec`` namespace (sglang/srt/arg_groups/fields/spec.py).  Namespaces
  whose modules import only msgspec (device, memory, mm, parallel) are
  registered the same way.
* Flags of the other namespaces (model, serving, schedule, exec_*, lora,
  disagg, observability -- their modules import torch via utils.common) and
  the few manual ``parser.add_argument`` calls in server_args.py are read with
  ``ast`` and registered from that (name, arity, int/float type and literal or
  arg_groups/choices.py choices; custom type_parser values and dynamic
  choices are not checked), so e.g. ``--model-path X`` is accepted and
  misspelled flags are still rejected.
* ``--speculative-algorithm`` is a free string in the parser; its valid
  values are the ``SpeculativeAlgorithm`` enum members (minus NONE) plus
  ``_RESERVED_ALIASES`` read with ``ast`` from sglang/srt/speculative/
  spec_info.py and spec_registry.py (``from_string`` upper-cases the name).

Cross-checked once against SGLang 0.5.23's real ``ServerArgs.add_cli_args``
(imported with torch and triton): the same 559 option strings, and all 44
speculative actions identical (type, choices, default, action).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import os
import shlex
import sys
import types

LIGHT_NAMESPACES = {  # module -> Struct classes importable with msgspec only
    "device": ["Device"],
    "memory": ["Memory"],
    "mm": ["Mm"],
    "parallel": ["Parallel"],
}
EAGLE_FAMILY = {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE"}


class ParseFailure(Exception):
    pass


class RaisingParser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print usage and sys.exit(2)
        raise ParseFailure(message)


def die(msg: str):
    print(msg, file=sys.stderr)
    raise SystemExit(2)


def locate_sglang() -> str:
    spec = importlib.util.find_spec("sglang")  # locates, does not import
    if spec is None or not spec.submodule_search_locations:
        die(
            "error: sglang is not installed for this interpreter "
            f"({sys.executable}). Run with the check environment's python "
            "(.venv-check/bin/python, made by `make check-env`)."
        )
    root = list(spec.submodule_search_locations)[0]
    if "sglang" not in sys.modules:
        pkg = types.ModuleType("sglang")
        pkg.__path__ = [root]
        pkg.__spec__ = spec
        pkg.__file__ = os.path.join(root, "__init__.py")
        sys.modules["sglang"] = pkg
    return root


def sglang_version(root: str) -> str:
    try:
        for entry in os.listdir(os.path.dirname(root)):
            if entry.startswith("sglang-") and entry.endswith(".dist-info"):
                return entry[len("sglang-") : -len(".dist-info")]
    except OSError:
        pass
    vfile = os.path.join(root, "version.py")
    if os.path.isfile(vfile):
        for node in ast.parse(open(vfile).read()).body:
            if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__version__":
                return ast.literal_eval(node.value)
    return "unknown"


# ---------------------------------------------------------------------------
# ast fallback for namespaces that cannot be imported without torch
# ---------------------------------------------------------------------------


def _arg_meta(ann: ast.Subscript):
    """From A[T, "help" | Arg(...), ...] return (inner_type_src, arg_kwargs) or None."""
    items = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
    if len(items) < 2:
        return None
    inner = ast.unparse(items[0])
    for meta in items[1:]:
        if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
            return inner, {}
        if isinstance(meta, (ast.JoinedStr, ast.BinOp)):
            return inner, {}
        if isinstance(meta, ast.Call) and ast.unparse(meta.func).split(".")[-1] == "Arg":
            return inner, {kw.arg: kw.value for kw in meta.keywords if kw.arg}
    return None


def ast_flags_of_module(path: str, skip_classes: set[str]) -> list[tuple[list[str], str, str]]:
    """Return [(names, arity, field)] for A[...]-annotated Struct fields.
    arity: 'flag' (store_true / BooleanOptionalAction), 'list' (nargs '+'), 'one'."""
    out = []
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef) or cls.name in skip_classes:
            continue
        for st in cls.body:
            if not (
                isinstance(st, ast.AnnAssign)
                and isinstance(st.target, ast.Name)
                and isinstance(st.annotation, ast.Subscript)
                and ast.unparse(st.annotation.value) in ("A", "Annotated")
            ):
                continue
            meta = _arg_meta(st.annotation)
            if meta is None:
                continue
            inner, kw = meta
            if "no_cli" in kw and ast.unparse(kw["no_cli"]) == "True":
                continue
            name = st.target.id
            cli = ast.literal_eval(kw["cli_name"]) if "cli_name" in kw else "--" + name.replace("_", "-")
            aliases = ast.literal_eval(kw["aliases"]) if "aliases" in kw else []
            action = ast.unparse(kw["action"]) if "action" in kw else ""
            names = [cli] + list(aliases)
            extra = _loose_value_spec(inner, kw)
            if "BooleanOptionalAction" in action:
                out.append((names + ["--no-" + n[2:] for n in names], "flag", name, {}))
            elif action:
                out.append((names, "one?", name, {}))
            elif inner in ("bool", "Optional[bool]"):
                out.append((names, "flag", name, {}))
            elif ("List[" in inner or "list[" in inner) and "type_parser" not in kw:
                if "nargs" in kw:
                    extra["nargs"] = ast.literal_eval(kw["nargs"])
                out.append((names, "list", name, extra))
            else:
                if "nargs" in kw:
                    try:
                        extra["nargs"] = ast.literal_eval(kw["nargs"])
                    except ValueError:
                        pass
                out.append((names, "one", name, extra))
    return out


def _choices_value(node: ast.AST):
    """Evaluate a choices= expression: a literal, or a name from arg_groups/choices.py."""
    try:
        return list(ast.literal_eval(node))
    except Exception:
        pass
    if isinstance(node, ast.Name):
        try:
            mod = importlib.import_module("sglang.srt.arg_groups.choices")
            val = getattr(mod, node.id, None)
            return list(val) if val is not None else None
        except Exception:
            return None
    return None


def _loose_value_spec(inner: str, kw: dict) -> dict:
    """Mirror add_cli_args_from_dataclass's type/choices for an ast-read field
    where that is possible without importing its module."""
    out: dict = {}
    if "type_parser" in kw:
        return out  # custom parser lives in a torch-importing module
    base = inner
    if base.startswith("Optional[") and base.endswith("]"):
        base = base[len("Optional[") : -1]
    for suffix in (" | None", "|None"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    if base.startswith(("List[", "list[")):
        base = base[5:-1]
    if base.startswith("Literal["):
        try:
            vals = list(ast.literal_eval("[" + base[len("Literal[") : -1] + "]"))
            out["choices"] = vals
            base = type(vals[0]).__name__ if vals else "str"
        except Exception:
            return {}
    if base in ("int", "float"):
        out["type"] = int if base == "int" else float
    if "choices" in kw:
        ch = _choices_value(kw["choices"])
        if ch is not None:
            out["choices"] = ch
    return out


def ast_manual_flags(server_args_py: str) -> list[tuple[list[str], str, str]]:
    """parser.add_argument("--x", ...) calls inside ServerArgs.add_cli_args."""
    out = []
    tree = ast.parse(open(server_args_py, encoding="utf-8").read(), server_args_py)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if not names:
                continue
            kw = {k.arg: ast.unparse(k.value) for k in node.keywords if k.arg}
            act = kw.get("action", "")
            if "store_true" in act.lower() or "StoreTrue" in act:
                arity = "flag"
            elif "nargs" in kw and kw["nargs"] in ("None",):
                arity = "one"
            else:
                arity = "one"
            extra = {}
            if "choices" in kw:
                node = next(k.value for k in node.keywords if k.arg == "choices")
                ch = _choices_value(node)
                if ch is not None:
                    extra["choices"] = ch
            out.append((names, arity, kw.get("dest", "").strip("'\"") or names[0][2:].replace("-", "_"), extra))
    return out


# ---------------------------------------------------------------------------
# Building the parser
# ---------------------------------------------------------------------------


class SGLangCLI:
    def __init__(self):
        self.root = locate_sglang()
        self.version = sglang_version(self.root)
        try:
            from sglang.srt.arg_groups.arg_utils import add_cli_args_from_dataclass
            from sglang.srt.arg_groups.fields.spec import Spec
        except ImportError as e:
            die(
                f"error: cannot import SGLang's arg_groups ({e}); "
                "install msgspec into the check venv, or this sglang version predates "
                "sglang/srt/arg_groups (then server_args.py must be parsed instead)"
            )
        self.Spec = Spec
        self.parser = RaisingParser(prog="sglang serve (flags check)", add_help=False, allow_abbrev=False)
        spec_group = self.parser.add_argument_group("spec (SGLang's own add_cli_args_from_dataclass)")
        add_cli_args_from_dataclass(spec_group, Spec)
        self.spec_dests = {a.dest for a in spec_group._group_actions}
        self.spec_actions = list(spec_group._group_actions)
        self.exact_sources = ["sglang/srt/arg_groups/fields/spec.py"]

        taken = set(self.parser._option_string_actions)
        for modname, classes in LIGHT_NAMESPACES.items():
            try:
                mod = importlib.import_module(f"sglang.srt.arg_groups.fields.{modname}")
            except ImportError:
                continue
            for cname in classes:
                cls = getattr(mod, cname, None)
                if cls is None:
                    continue
                g = self.parser.add_argument_group(f"{modname} (own code)")
                # required=True on a non-spec field would make every check fail
                add_cli_args_from_dataclass(g, cls)
                for act in g._group_actions:
                    act.required = False
                self.exact_sources.append(f"sglang/srt/arg_groups/fields/{modname}.py")

        # Loose registration of everything else, read with ast.
        fields_dir = os.path.join(self.root, "srt", "arg_groups", "fields")
        loose = []
        for fn in sorted(os.listdir(fields_dir)):
            if not fn.endswith(".py") or fn == "__init__.py":
                continue
            modname = fn[:-3]
            skip = set(LIGHT_NAMESPACES.get(modname, [])) | ({"Spec"} if modname == "spec" else set())
            loose += ast_flags_of_module(os.path.join(fields_dir, fn), skip)
        loose += ast_manual_flags(os.path.join(self.root, "srt", "server_args.py"))
        g = self.parser.add_argument_group("other namespaces (ast: name/arity only)")
        self.loose_flags = set()
        for names, arity, dest, extra in loose:
            names = [n for n in names if n not in taken and n not in self.parser._option_string_actions]
            if not names:
                continue
            kwargs = {"dest": "_loose_" + dest}
            if arity in ("one", "list"):
                kwargs.update(extra)
            if arity == "flag":
                kwargs["action"] = "store_true"
            elif arity == "list":
                kwargs["nargs"] = extra.pop("nargs", "+")
            elif arity == "one?":
                kwargs["nargs"] = "*"  # custom argparse action: accept any arity
            g.add_argument(*names, **kwargs)
            self.loose_flags.update(names)

        self.algorithms, self.aliases = self._algorithms()

    def _algorithms(self) -> tuple[list[str], list[str]]:
        sdir = os.path.join(self.root, "srt", "speculative")
        members, aliases = [], []
        info = os.path.join(sdir, "spec_info.py")
        if os.path.isfile(info):
            for cls in ast.parse(open(info).read()).body:
                if isinstance(cls, ast.ClassDef) and cls.name == "SpeculativeAlgorithm":
                    for st in cls.body:
                        if isinstance(st, ast.Assign):
                            for t in st.targets:
                                if isinstance(t, ast.Name) and t.id != "NONE":
                                    members.append(t.id)
        reg = os.path.join(sdir, "spec_registry.py")
        if os.path.isfile(reg):
            for st in ast.parse(open(reg).read()).body:
                if (
                    isinstance(st, ast.Assign)
                    and isinstance(st.targets[0], ast.Name)
                    and st.targets[0].id == "_RESERVED_ALIASES"
                ):
                    for node in ast.walk(st.value):
                        if isinstance(node, ast.Constant) and isinstance(node.value, str):
                            aliases.append(node.value)
        return members, aliases

    # -- listing ------------------------------------------------------------
    def listing(self) -> str:
        lines = [f"sglang {self.version}: speculative flags (sglang/srt/arg_groups/fields/spec.py)"]
        for act in self.spec_actions:
            names = ", ".join(act.option_strings)
            if isinstance(act, (argparse._StoreTrueAction, argparse.BooleanOptionalAction)):
                kind = "flag"
            else:
                kind = getattr(act.type, "__name__", "str") + (f" nargs={act.nargs}" if act.nargs else "")
            ch = f" choices={list(act.choices)}" if act.choices else ""
            lines.append(f"  {names}  [{kind}] default={act.default!r}{ch}")
        lines.append(f"  --speculative-algorithm values (case-insensitive): {self.algorithms} + aliases {self.aliases}")
        return "\n".join(lines)

    # -- checking -----------------------------------------------------------
    def check(self, argv: list[str]) -> tuple[list[str], list[str], dict]:
        errors, warnings = [], []
        try:
            ns = self.parser.parse_args(argv)
        except ParseFailure as e:
            return [f"sglang's parser: {e}"], [], {}
        spec = {d: getattr(ns, d) for d in self.spec_dests}
        used_loose = sorted({a.split("=")[0] for a in argv if a.split("=")[0] in self.loose_flags})
        if used_loose:
            warnings.append(
                "non-speculative flags checked from ast only (name, int/float type, "
                f"literal choices): {' '.join(used_loose)}"
            )

        algo = spec.get("speculative_algorithm")
        ALGO = algo.upper() if isinstance(algo, str) else None
        if algo is not None and ALGO not in self.algorithms and ALGO not in self.aliases:
            errors.append(
                f"--speculative-algorithm {algo!r}: Unknown speculative algorithm name "
                f"(SpeculativeAlgorithm.from_string); builtins: {self.algorithms}, "
                f"aliases: {self.aliases} (plugins may register more)"
            )
        steps = spec.get("speculative_num_steps")
        topk = spec.get("speculative_eagle_topk")
        ndraft = spec.get("speculative_num_draft_tokens")
        adaptive = spec.get("speculative_adaptive")
        if algo is None:
            set_spec = [
                f"--{d.replace('_', '-')}"
                for d in self.spec_dests
                if d != "speculative_algorithm" and spec[d] != self._default(d)
            ]
            if set_spec:
                warnings.append(f"no --speculative-algorithm: {' '.join(sorted(set_spec))} have no effect")
        if ALGO in EAGLE_FAMILY:
            if not adaptive and steps is None and (topk is not None or ndraft is not None):
                errors.append(
                    f"{ALGO}: --speculative-eagle-topk/--speculative-num-draft-tokens given "
                    "without --speculative-num-steps (_handle_eagle_family asserts all three "
                    "are set or all are unset)"
                )
            if topk == 1 and steps is not None and ndraft is not None and ndraft != steps + 1:
                warnings.append(
                    f"eagle_topk=1: SGLang resets --speculative-num-draft-tokens {ndraft} to num_steps+1 = {steps + 1}"
                )
            if ALGO == "STANDALONE" and not spec.get("speculative_draft_model_path"):
                errors.append("STANDALONE needs --speculative-draft-model-path (the small draft model)")
            if ALGO == "STANDALONE" and steps is None and not adaptive:
                warnings.append(
                    "STANDALONE without --speculative-num-steps: SGLang auto-picks "
                    "(steps, topk, draft_tokens) = (3, 1, 4)"
                )
        if ALGO == "NGRAM":
            if topk is not None:
                warnings.append("NGRAM ignores --speculative-eagle-topk (set to --speculative-ngram-max-bfs-breadth)")
            if spec.get("speculative_draft_model_path"):
                warnings.append("NGRAM does not use --speculative-draft-model-path")
            if ndraft is None:
                warnings.append("NGRAM without --speculative-num-draft-tokens: SGLang uses 12")
        if adaptive and ALGO not in ("EAGLE", "EAGLE3", "NEXTN"):
            warnings.append(
                f"--speculative-adaptive is auto-disabled for {ALGO} (adaptive_unsupported_reason: only EAGLE/EAGLE3)"
            )
        if adaptive and topk not in (None, 1):
            warnings.append("--speculative-adaptive is auto-disabled unless --speculative-eagle-topk is 1")
        if spec.get("speculative_use_rejection_sampling") and ALGO not in ("EAGLE", "EAGLE3", "NEXTN"):
            errors.append("--speculative-use-rejection-sampling is only supported for EAGLE/EAGLE3/NEXTN")
        for d in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"):
            v = spec.get(d)
            if isinstance(v, int) and v < (0 if d == "speculative_num_steps" else 1):
                errors.append(f"--{d.replace('_', '-')} must be positive, got {v}")
        return errors, warnings, spec

    def _default(self, dest):
        for act in self.spec_actions:
            if act.dest == dest:
                return act.default
        return None


def main(argv: list[str]) -> int:
    if "--" in argv:
        i = argv.index("--")
        own, flags = argv[:i], argv[i + 1 :]
    else:
        own, flags = argv, None
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flags-file", help="file with shell-quoted flags (instead of '-- FLAGS...')")
    ap.add_argument("--list", action="store_true", help="list the speculative flags and choices")
    ap.add_argument("-q", "--quiet", action="store_true", help="no warnings on success")
    ap.add_argument("--show", action="store_true", help="print the parsed speculative values")
    a = ap.parse_args(own)

    cli = SGLangCLI()
    if a.list:
        print(cli.listing())
        return 0
    if a.flags_file:
        with open(a.flags_file, encoding="utf-8") as f:
            flags = shlex.split(f.read(), comments=True)
    if flags is None:
        ap.error("give the flags after '--' or with --flags-file")
    errors, warnings, spec = cli.check(flags)
    where = f"sglang {cli.version} ({cli.root})"
    if errors:
        print(f"FAIL: flags rejected by {where}:", file=sys.stderr)
        for e in errors:
            print(f"  - {e}", file=sys.stderr)
        for w in warnings:
            print(f"  (warning) {w}", file=sys.stderr)
        return 1
    print(f"OK: flags accepted by {where}")
    if not a.quiet:
        for w in warnings:
            print(f"  (warning) {w}")
    if a.show:
        for k in sorted(spec):
            if spec[k] != cli._default(k):
                print(f"  {k} = {spec[k]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
