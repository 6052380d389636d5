"""The Run page's logic without Streamlit: form choices, the session spec, and the live view's numbers."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app import data
from engine.errors import SettingsError
from engine.models.bundled import BUNDLED, DEFAULT_DRAFT, DEFAULT_TARGET
from engine.session.spec import SessionSpec

GAMMA_CHOICES = list(range(1, 17))
DTYPES = ["float32", "bfloat16", "float16"]
DEFAULT_PROMPTS = 8
NGRAM = "ngram"
_QUANT = re.compile(r"\b(I?Q\d\w*|BF16|F16|F32)\b")


def bundled_names() -> list[str]:
    return list(BUNDLED)


def default_target_index() -> int:
    names = bundled_names()
    return names.index(DEFAULT_TARGET) if DEFAULT_TARGET in names else 0


def bundled_label(name: str) -> str:
    model = BUNDLED.get(name)
    return f"{name} — {model.description}" if model else name


def default_dtype(hardware_kind: str | None) -> str:
    return "bfloat16" if hardware_kind == "cuda" else "float32"


def effective_target(choice: str | None, text: str | None) -> str:
    """The typed target when there is one, else the chosen bundled model."""
    return (text or "").strip() or (choice or "")


def draft_options(target: str) -> list[str]:
    """The bundled models and 'ngram', without the target itself."""
    return [name for name in [*bundled_names(), NGRAM] if name != target]


def default_drafts(options: Sequence[str]) -> list[str]:
    return [DEFAULT_DRAFT] if DEFAULT_DRAFT in options else []


def quantisation(target: str) -> str | None:
    """The GGUF quantisation a bundled model is shipped in ('Q4_K_M'), when its description names one."""
    model = BUNDLED.get(target)
    if model is None:
        return None
    found = _QUANT.search(f"{model.description} {model.file_in_module or ''}")
    return found.group(1) if found else None


def target_note(target: str, dtype: str) -> str | None:
    """What the engine does with a GGUF target's weights; None for anything that is not a GGUF."""
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
        detect_regime=bool(form.detect_regime),
        serving_batch=int(form.serving_batch),
    )
    return spec, int(form.prompt_set_id), int(form.n_prompts)


def session_to_watch(sessions: Sequence[Mapping[str, Any]]) -> int | None:
    """The session the live view opens on: the running one, else the next queued, else the newest."""
    for status in ("running", "queued"):
        found = next((s["id"] for s in sessions if s.get("status") == status), None)
        if found is not None:
            return found
    return sessions[0]["id"] if sessions else None


def run_numbers(store: Any, run: Mapping[str, Any] | None, final: bool) -> dict[str, Any]:
    """A run's speed and acceptance: its final measured numbers when ``final``, else live totals from its
    logged steps (tokens/s over decode-step time only, so a live run is compared on the same basis)."""
    if run is None:
        return {}
    return live_numbers(run, store.run_progress(run["id"]), final)


def live_numbers(run: Mapping[str, Any], progress: Mapping[str, Any], final: bool) -> dict[str, Any]:
    """run_numbers on an already read progress dict."""
    keys = ("tokens_per_s", "draft_acceptance_rate", "mean_acceptance_length", "steps")
    numbers = {key: progress.get(key) for key in keys}
    if final:
        for key in ("tokens_per_s", "mean_acceptance_length"):
            if run.get(key) is not None:
                numbers[key] = run[key]
    return numbers


def speed_delta(tps: float | None, base_tps: float | None) -> str | None:
    if not tps or not base_tps:
        return None
    return f"{tps / base_tps - 1:+.0%} vs baseline ({tps / base_tps:.2f}×)"


def current_run(runs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The running run, else the last one."""
    return next((r for r in reversed(runs) if r.get("status") == "running"), runs[-1])


def latest_output(store: Any, runs: Sequence[Mapping[str, Any]]) -> tuple[Mapping, Mapping] | None:
    """(run, output) of the newest stored output, from the last run that has one."""
    for run in reversed(runs):
        outputs = store.get_outputs(run["id"])
        if outputs:
            return run, outputs[-1]
    return None


def output_title(run: Mapping[str, Any], output: Mapping[str, Any]) -> str:
    """'<run>, prompt 3': prompts are numbered from 1, as on the Prompts page."""
    index = output.get("prompt_index")
    number = int(index) + 1 if isinstance(index, int) else "?"
    return f"{data.run_label(run)}, prompt {number}"
