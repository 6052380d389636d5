"""The Run page's form without Streamlit: its choices, their defaults and notes, and the session spec it makes."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app import data
from engine.errors import SettingsError
from engine.service.api import (
    BUNDLED,
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    LOOPS,
    SessionSpec,
    StoredSession,
    draft_kinds,
    parameter_count,
    policy_kinds,
    registry,
)

GAMMA_CHOICES = list(range(1, 17))

DTYPES = ["float32", "bfloat16", "float16"]

DEFAULT_PROMPTS = 8

_QUANT = re.compile(r"\b(I?Q\d\w*|BF16|F16|F32)\b")


def offered_kinds() -> list[Any]:
    """The draft kinds the form offers by a reference of their own (`offered`): those that need no model."""
    return [kind for kind in draft_kinds() if kind.offered and not kind.needs_model]


def drafts_help() -> str:
    """The Run form's help on draft candidates: what each kind offered besides the models does."""
    kinds = ", ".join(kind.help for kind in offered_kinds() if kind.help)
    return f"{kinds}: no second model. The target itself is not offered."


CONCURRENCY_INPUT = {
    "placeholder": "1,2,4,8 (vLLM's default; other engines decode one request at a time)",
    "help": "Each configuration is measured with this many requests in flight, level by level; its speedup is "
    "against the target alone at the same level.",
}


def bundled_names() -> list[str]:
    return list(BUNDLED)


def default_target_index() -> int:
    names = bundled_names()
    return names.index(DEFAULT_TARGET) if DEFAULT_TARGET in names else 0


def bundled_label(name: str) -> str:
    model = BUNDLED.get(name)
    return f"{name} — {model.description}" if model else name


TARGET_PLACEHOLDER = "local path, .gguf, cached model id, or tiny:SEED:VOCAB:LAYERS:HIDDEN"

DRAFTS_PLACEHOLDER = "path, model id, tiny:1:48:2:64~0.15, ngram:3, suffix:24:1:0.1:0 (cold)"


def default_dtype(hw: Mapping[str, Any]) -> str:
    """The dtype this machine runs well (engine.measure.hardware.default_dtype), as the hardware description says."""
    return str(hw.get("default_dtype") or "float32")


def effective_target(choice: str | None, text: str | None) -> str:
    """The typed target when there is one, else the chosen bundled model."""
    return (text or "").strip() or (choice or "")


def draft_options(target: str, engine: str | None = None) -> list[str]:
    """The drafts the form offers for this target in this engine: the bundled models no larger than the target
    (a draft is the smaller model) and not the target itself, and each kind without a model ('ngram', 'suffix'),
    without those the engine refuses (llama.cpp has no suffix decoding)."""
    size = parameter_count(target)
    models = [
        name for name in bundled_names() if name != target and (size is None or (parameter_count(name) or 0) <= size)
    ]
    return [
        name
        for name in [*models, *(kind.offered for kind in offered_kinds())]
        if name != target and (engine is None or not draft_refused(engine, name))
    ]


@functools.cache
def draft_refused(engine: str, draft: str) -> bool:
    """Whether `engine` refuses a session with this draft that it accepts with the default draft (its own
    validation decides: no engine is named here)."""
    entry = registry.get(engine)

    def refused(drafts: list[str]) -> bool:
        try:
            entry.validate(SessionSpec(target=DEFAULT_TARGET, drafts=drafts, gammas=[1], engine=entry.name), None)
        except SettingsError:
            return True
        return False

    return not refused([DEFAULT_DRAFT]) and refused([draft])


def default_drafts(options: Sequence[str]) -> list[str]:
    return [DEFAULT_DRAFT] if DEFAULT_DRAFT in options else []


def quantisation(target: str) -> str | None:
    """The GGUF quantisation a bundled model is shipped in ('Q4_K_M'), when its description names one."""
    model = BUNDLED.get(target)
    if model is None:
        return None
    found = _QUANT.search(f"{model.description} {model.file_in_module or ''}")
    return found.group(1) if found else None


ENGINE_LABELS = {name: registry.get(name).label for name in registry.sweep_engines()}


def sweeps_regime(engine: str) -> bool:
    """Whether the engine's sessions can run the batch sweep and roofline afterwards (its target runs here)."""
    return registry.get(engine).in_process


def no_regime_note(engine: str) -> str:
    return (
        f"{registry.get(engine).label} runs no batch sweep (its target runs outside this process): on Recommend "
        "the regime comes from a spectune session of the same target chosen beside it, else it is assumed "
        "memory-bound and said so"
    )


def engine_note(engine: str) -> tuple[bool, str]:
    """(usable, one line) for the engine choice: what it measures, or why it cannot run here."""
    return registry.get(engine).availability()


def target_note(target: str, dtype: str, engine: str = "spectune") -> str | None:
    """What the engine does with a GGUF target's weights; None for anything that is not a GGUF."""
    if registry.get(engine).fixed_weights:
        return f"{target}: served from its {registry.get(engine).fixed_weights}, no dequantisation"
    if target in BUNDLED:
        quant = quantisation(target)
        return f"{target}: GGUF {quant + ', ' if quant else ''}dequantised to {dtype} for this engine"
    if target.lower().endswith(".gguf"):
        return f"GGUF file, dequantised to {dtype} for this engine"
    return None


def prompt_count_limits(set_size: int | None) -> tuple[int, int]:
    """(largest, default) for 'How many prompts': never above the set size, by default min(8, set size)."""
    largest = max(1, int(set_size or 0))
    return largest, min(DEFAULT_PROMPTS, largest)


@dataclass
class RunForm:
    """The Run form's values as the widgets return them."""

    target_choice: str | None
    target_text: str
    drafts_choice: Sequence[str]
    drafts_text: str
    gammas_choice: Sequence[int]
    gammas_text: str
    temps_text: str
    max_new_tokens: int
    dtype: str
    prompt_set_id: int | None
    n_prompts: int
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    device: str = "auto"
    chat_template: bool = True
    measure_verify_cost: bool = True
    detect_regime: bool = True
    serving_batch: int = 1
    stratified: bool = False  # the prompts: a sample stratified by category, or the first n in file order
    engine: str = "spectune"
    policies_text: str = ""  # speculation policies also run live, separated by spaces or ';'
    concurrency_text: str = ""  # requests in flight per measurement (an engine that batches); "" = its default
    mode: str = "quick"  # quick: probe, predict, confirm; full: every configuration (engine.session.quick)
    confirm: bool = True  # full mode: run the headline live when the grid did not measure it
    loop: str = "auto"  # spectune's loop: auto, eager or compiled (engine.core.compiled)
    threads: int = 0  # spectune's CPU threads; 0: the cores other processes leave free when the session starts

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> RunForm:
        """The form as the page's widgets left it in session state (widget keys: field names, or _WIDGET_KEYS)."""
        values = {}
        for name in cls.__dataclass_fields__:
            key = _WIDGET_KEYS.get(name, name)
            if key in state:
                values[name] = state[key]
        return cls(**values)


_WIDGET_KEYS = {"max_new_tokens": "max_new", "measure_verify_cost": "measure_verify", "prompt_set_id": "prompt_set"}


def session_spec(form: RunForm) -> tuple[SessionSpec, int, int]:
    """(spec, prompt set id, prompt count) from the form; SettingsError naming the first problem."""
    if form.prompt_set_id is None:
        raise SettingsError("no prompt set chosen: import one on the Prompts page first")
    drafts = list(dict.fromkeys([*form.drafts_choice, *data.parse_refs(form.drafts_text)]))
    if not drafts:
        raise SettingsError("no draft chosen: pick a draft model or 'ngram', or type one")
    typed = (form.gammas_text or "").strip()
    gammas = data.parse_int_list(typed, "γ") if typed else sorted(form.gammas_choice)
    if not gammas:
        raise SettingsError("no γ chosen: pick γ values or type them, e.g. 1,2,4,8")
    spec = SessionSpec(
        target=effective_target(form.target_choice, form.target_text),
        drafts=drafts,
        gammas=gammas,
        temperatures=data.parse_float_list(form.temps_text or "", "temperature"),
        max_new_tokens=int(form.max_new_tokens),
        top_k=int(form.top_k),
        top_p=float(form.top_p),
        seed=int(form.seed),
        dtype=form.dtype,
        device=form.device,
        chat_template=bool(form.chat_template),
        measure_verify_cost=bool(form.measure_verify_cost),
        detect_regime=bool(form.detect_regime) and sweeps_regime(form.engine),
        serving_batch=int(form.serving_batch),
        prompt_sample="stratified" if form.stratified else "first",
        engine=form.engine,
        policies=policy_specs(form.policies_text),
        mode=form.mode,
        confirm=form.mode == "full" and bool(form.confirm),
        engine_options=registry.options_from_values(
            form.engine, {"loop": form.loop, "threads": int(form.threads) or None}
        ),
    )
    levels = (form.concurrency_text or "").strip()
    spec.concurrency = registry.concurrency_for(
        form.engine, data.parse_int_list(levels, "concurrency") if levels else None
    )
    return spec, int(form.prompt_set_id), int(form.n_prompts)


LOOP_CHOICES = LOOPS

LOOP_HELP = (
    "spectune's engine only. Compiled: a static KV cache and compiled forwards (one CUDA graph per width on a GPU), "
    "compiled once per worker before decoding; eager: plain PyTorch. Auto times both once per machine, target and "
    "dtype and keeps the faster. On a GPU the eager loop measures Python's kernel launches, not the GPU."
)

THREADS_HELP = (
    "spectune's engine on a CPU: the intra-op threads every configuration decodes with. 0 counts the cores other "
    "processes leave free when the session starts, as llama-server's -t is chosen."
)

FORM_KEYS = (  # the new-session form's inputs, kept when the user visits another page and comes back
    "target_choice", "target_text", "dtype", "prompt_set", "engine", "mode", "confirm", "drafts_choice", "drafts_text",
    "gammas_choice", "gammas_text", "policies_text", "temps_text", "max_new", "n_prompts", "stratified",
    "session_name", "top_k", "top_p", "seed", "device", "chat_template", "measure_verify", "detect_regime",
    "serving_batch", "concurrency_text", "loop", "threads", "budget",
)  # fmt: skip

SUBMITTED_FORM = "run_form_submitted"  # no widget owns this key: Streamlit keeps it while the Run page is not drawn


def save_form(state: Any) -> None:
    """Copy the form's values, as just submitted, under a key no widget owns (a widget's own key is dropped after a
    run of another page, which does not draw it)."""
    state[SUBMITTED_FORM] = {key: state[key] for key in FORM_KEYS if key in state}


def restore_form(state: Any) -> None:
    """Before the form is drawn: every value Streamlit dropped while another page was shown set again as it was
    last submitted, so the widgets start from it (a value still there, changed since, is left as it is)."""
    for key, value in (state.get(SUBMITTED_FORM) or {}).items():
        if key not in state:
            state[key] = value


MODE_LABELS = {
    "quick": "Quick: each draft once, every γ and policy predicted, the best confirmed live",
    "full": "Full grid: every draft × γ × policy measured",
}

MODE_HELP = (
    "Quick runs the target alone and each draft once at the widest γ (its recorded pass reaches every γ listed), "
    "predicts every γ and policy from that pass with the one prediction model, then runs what it recommends and "
    "the best fixed γ live beside the target alone to confirm them. Full measures every configuration."
)

CONFIRM_LABEL = "Full grid: run the recommended configuration live when the grid did not measure it"

CONFIRM_HELP = (
    "After the grid, the one model recommends from what it measured; when that is a γ (or policy) the grid did "
    "not run — an extrapolation — it runs live beside the target alone at every concurrency level, so the "
    "recommendation rests on a measurement of it. A quick session always confirms."
)


def policy_help() -> str:
    """The Run form's help on drafting policies: every registered kind but the fixed γ, and what it does."""
    kinds = "; ".join(f"{kind.grammar} ({kind.summary})" for kind in policy_kinds() if kind.name != "fixed")
    return (
        f"Besides the fixed γs, run these drafting policies live, separated by spaces: {kinds}. Every policy is "
        "replayed from the session anyway (Policies page); running one live checks the replay. llama.cpp runs fixed "
        "γ and confidence:P:NMAX:NMIN only. A quick session predicts every policy instead and runs the best one live."
    )


def policies_suffix(session: Mapping[str, Any]) -> str:
    """' · policies a, b' for a stored session that runs drafting policies live besides its fixed γs, else ''."""
    policies = StoredSession.of(session).policies
    return f" · policies {', '.join(policies)}" if policies else ""


def policy_specs(text: str | None) -> list[str]:
    """The policies typed in the Run form: separated by spaces or ';' (commas belong to adaptive's candidates)."""
    return [part for part in re.split(r"[\s;]+", text or "") if part]


def default_sample(categories: Mapping[str, int] | None) -> bool:
    """Stratify by category by default when the set names two or more categories."""
    return len([c for c in (categories or {}) if c]) >= 2


def sample_option(categories: Mapping[str, int] | None) -> dict[str, Any]:
    """The "stratified by category" checkbox's value, whether it can be changed, and its help."""
    named = [c for c in categories or {} if c]
    if len(named) < 2:
        return {"value": False, "disabled": True, "help": "The chosen set has fewer than two categories."}
    return {
        "value": True,
        "disabled": False,
        "help": f"Every category ({', '.join(named)}) gets prompts, in proportion to its size; off: the first "
        "prompts in file order, which may leave whole categories out.",
    }
