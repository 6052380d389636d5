"""The Run page's logic without Streamlit: form choices, the session spec, and the live view's numbers."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app import data
from engine.errors import SettingsError
from engine.service.api import (
    BUNDLED,
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    LOOPS,
    LoopOptions,
    SessionSpec,
    compared_baseline,
    draft_acceptance_rate,
    parameter_count,
    registry,
    tokens_per_call,
)

GAMMA_CHOICES = list(range(1, 17))
DTYPES = ["float32", "bfloat16", "float16"]
DEFAULT_PROMPTS = 8
NGRAM = "ngram"
SUFFIX = "suffix"  # suffix decoding with vLLM's defaults; suffix:DEPTH:SPEC_FACTOR:MIN_PROB:CACHED typed
_QUANT = re.compile(r"\b(I?Q\d\w*|BF16|F16|F32)\b")

DRAFTS_HELP = (
    "'ngram' drafts by prompt lookup, 'suffix' by suffix decoding (a suffix tree of the prompt and of earlier "
    "responses, warm after the first prompt): no second model. The target itself is not offered."
)
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
ESTIMATE_HELP = (
    "The form's session, not queued: its live configurations, the time at the pace of the newest "
    "comparable session on this machine (else of a probe: see the button below), and the memory its "
    "models' weights or servers hold."
)


PROBE_HELP = (
    "Time the target alone in the chosen engine and dtype (its load, then up to 16 tokens of the set's "
    "first prompt, at most 60 s of decoding, in a child process), so the estimate has a pace before any "
    "such session has run here. Its stage, the tokens timed and the seconds gone show while it runs."
)


def estimate_lines(
    store: Any, state: Mapping[str, Any], probe: bool = False, on_progress: Callable[[Any], None] | None = None
) -> list[str]:
    """What the form's session would take (engine.service.estimate), one sentence each, after timing the target
    alone when `probe` (engine.service.pace_probe; `on_progress` is told where the probe is while it runs);
    SpectuneError when the form is invalid (the same message Start would give) or the probe fails."""
    from engine.service.api import estimate_for, estimate_with_probe, first_prompt

    spec, set_id, count = session_spec(RunForm.from_state(state))
    if not probe:
        return estimate_for(store, spec, count).sentences()
    done = estimate_with_probe(store, spec, count, first_prompt(store, set_id), on_progress)
    if done.probe_s is None:
        return ["Not probed: a finished session on this machine gives the pace.", *done.estimate.sentences()]
    timed = f": {done.probe.timed()}" if done.probe is not None else ""
    return [f"Probed the target alone in {done.probe_s:.0f} s{timed}.", *done.estimate.sentences()]


def probe_progress_text(progress: Any) -> str:
    """A running pace probe (engine.service.pace_probe.ProbeProgress) in words: loading and for how long, then
    its untimed first pass, then the tokens timed so far beside the bound on its decoding."""
    from engine.service.api import DECODE_BOUND_S, PROBE_TOKENS

    if progress.load_s is None:
        return f"Probing the pace: loading the target… {progress.elapsed_s:.0f} s so far."
    loaded = f"Probing the pace: loaded in {progress.load_s:.0f} s"
    if progress.stage == "priming":
        return f"{loaded}; a first, untimed pass over the prompt… {progress.stage_s:.0f} s."
    return (f"{loaded}; decoding: {progress.tokens} of {PROBE_TOKENS} tokens timed in {progress.stage_s:.0f} s "
            f"(decoding stops after {DECODE_BOUND_S:.0f} s).")  # fmt: skip


def default_dtype(hw: Mapping[str, Any]) -> str:
    """The dtype this machine runs well (engine.measure.hardware.default_dtype), as the hardware description says."""
    return str(hw.get("default_dtype") or "float32")


def effective_target(choice: str | None, text: str | None) -> str:
    """The typed target when there is one, else the chosen bundled model."""
    return (text or "").strip() or (choice or "")


def draft_options(target: str, engine: str | None = None) -> list[str]:
    """The drafts the form offers for this target in this engine: the bundled models no larger than the target
    (a draft is the smaller model) and not the target itself, 'ngram' and 'suffix', without those the engine
    refuses (llama.cpp has no suffix decoding)."""
    size = parameter_count(target)
    models = [name for name in bundled_names() if name != target
              and (size is None or (parameter_count(name) or 0) <= size)]  # fmt: skip
    return [name for name in [*models, NGRAM, SUFFIX]
            if name != target and (engine is None or not draft_refused(engine, name))]  # fmt: skip


@functools.cache
def draft_refused(engine: str, draft: str) -> bool:
    """Whether `engine` refuses a session with this draft that it accepts with the default draft (its own
    validation decides: no engine is named here)."""
    entry = registry.get(engine)

    def refused(drafts: list[str]) -> bool:
        try:
            entry.validate(SessionSpec(target=DEFAULT_TARGET, drafts=drafts, gammas=[1]), None)
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
    return (f"{registry.get(engine).label} runs no batch sweep (its target runs outside this process): on Recommend "
            "the regime comes from a spectune session of the same target chosen beside it, else it is assumed "
            "memory-bound and said so")  # fmt: skip


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
        loop=LoopOptions(form.loop, int(form.threads) or None),
    )
    levels = (form.concurrency_text or "").strip()
    spec.concurrency = registry.concurrency_for(form.engine, data.parse_int_list(levels, "concurrency") if levels
                                                else None)  # fmt: skip
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


def confirmation_lines(
    session: Mapping[str, Any], runs: Sequence[Mapping[str, Any]] = (), decisions: Mapping[float, Any] | None = None
) -> list[str]:
    """A full session's confirmation in words: what the grid's recommendation was and how it measured (each
    configuration's figures as stored, the Sessions page's; the recommendation as the Recommend page gives it)."""
    done = (session.get("summary") or {}).get("confirmation")
    if not done:
        return []
    if not done.get("ran"):
        rows = done.get("confirmed") or []
        named = ", ".join(c["configuration"] for c in rows) or "nothing to confirm"
        return [f"Recommendation checked against the grid: {named} — measured by the grid itself.",
                *headline_lines(decisions)]  # fmt: skip
    took, grid = done.get("confirm_s", 0.0) / 60.0, done.get("grid_s", 0.0) / 60.0
    lines = [f"The grid's recommendation was not in the grid: ran {', '.join(done['ran'])} live "
             f"({took:.1f} min after the grid's {grid:.1f} min)."]  # fmt: skip
    return lines + _choice_lines(done, runs, decisions)


def quick_lines(
    session: Mapping[str, Any], runs: Sequence[Mapping[str, Any]] = (), decisions: Mapping[float, Any] | None = None
) -> list[str]:
    """A finished quick session in words: how long to a confirmed recommendation, the recommendation as the
    stored decision (`decisions`: per temperature, engine.service.decisions.Decision or None), and each
    choice as its stored run measured it (`runs`: the session's runs)."""
    quick = (session.get("summary") or {}).get("quick")
    if not quick:
        return []
    minutes = quick.get("time_to_confirmed_s", 0.0) / 60.0
    lines = [f"Quick session: confirmed in {minutes:.1f} min (probe {quick.get('probe_s', 0.0) / 60.0:.1f} min)."]
    return lines + _choice_lines(quick, runs, decisions) + unchosen_gamma_lines(session, quick)


def unchosen_gamma_lines(session: Mapping[str, Any], done: Mapping[str, Any]) -> list[str]:
    """Why a confirmed fixed γ the form did not list ran at all: the one model predicts every γ from the probe,
    and what it recommends is confirmed live whether or not it was among the γs chosen."""
    chosen = {int(g) for g in session.get("gammas") or []}
    lines = []
    for c in done.get("confirmed") or []:
        gamma = int(c.get("gamma") or 0)
        if chosen and not c.get("policy") and gamma >= 1 and gamma not in chosen:
            listed = ", ".join(map(str, sorted(chosen)))
            lines.append(f"Why γ={gamma}: it was not among the γs chosen ({listed}); a quick session predicts every γ "
                         f"from its probe and runs the one it recommends live, so γ={gamma} was measured to confirm "
                         "it.")  # fmt: skip
    return lines


def choice_lines(
    session: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], decisions: Mapping[float, Any] | None
) -> list[str]:
    """A finished session's confirmed choices in words: a quick session's (quick_lines), else a full session's
    confirmation (confirmation_lines)."""
    return quick_lines(session, runs, decisions) or confirmation_lines(session, runs, decisions)


def has_choices(session: Mapping[str, Any]) -> bool:
    """Whether a session's summary says what it confirmed (a quick session, or a full one that checked its
    recommendation against the grid)."""
    summary = session.get("summary") or {}
    return bool(summary.get("quick") or summary.get("confirmation"))


def headline_lines(decisions: Mapping[float, Any] | None) -> list[str]:
    """The session's decision per temperature (engine.service.decisions.Decision, stored when it ended): the one
    answer the Recommend page, the CLI, the report and the exports give."""
    return [f"Decision: {d.headline()}" for _, d in sorted((decisions or {}).items()) if d is not None]


def _choice_lines(
    done: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], decisions: Mapping[float, Any] | None
) -> list[str]:
    """The decision, then each configuration the session confirmed as its stored run measured it (the figures the
    Sessions page shows: the stored prediction, the whole run's speedup and the per-prompt spread, its flag): the
    decision's own configuration called recommended, the others what they are; then the notes."""
    lines = headline_lines(decisions)
    stored_off = {float(t) for t, is_off in (done.get("off") or {}).items() if is_off}
    for c in done.get("confirmed") or []:
        temperature = float(c["temperature"])
        decision = (decisions or {}).get(temperature)
        off = decision.off if decision is not None else temperature in stored_off
        predicted = None
        if off:
            role = "Speculation OFF; best candidate, not recommended"
        elif decision is None:  # nothing to decide from stored (its runs are gone): the role it was chosen in
            role = str(c["role"]).capitalize()
        elif _is_decided(c, decision):
            role, predicted = "Recommended (the decision)", decision.predicted_speedup  # one figure: the decision's
        else:
            role = "Also confirmed, not the decision"
        lines.append(f"{role}: {c['configuration']} — {_choice_figures(c, runs, predicted)}.")
    lines += [f"Note: {n}" for n in done.get("notes") or []]
    return lines


def _is_decided(choice: Mapping[str, Any], decision: Any) -> bool:
    """Whether a confirmed choice is the decision's configuration (its draft and policy, or its draft and γ)."""
    if choice.get("draft") != decision.draft:
        return False
    if decision.policy:
        return choice.get("policy") == decision.policy
    return not choice.get("policy") and int(choice.get("gamma") or 0) == int(decision.gamma)


def _choice_figures(choice: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], decided: float | None = None) -> str:
    """'predicted 1.01×, measured 0.90× over the whole run (0.85–0.95× (median 0.91×))' from the choice's stored
    run; a session stored without its runs says what the choice itself kept (the prediction when chosen)."""
    from engine.service.api import (
        configuration_run,
        run_speedups,
        run_spread,
        spread_text,
        stored_noisy,
        stored_speedup_flag,
    )

    run = configuration_run(runs, str(choice["draft"]), int(choice.get("gamma") or 0), float(choice["temperature"]),
                            choice.get("policy"))  # fmt: skip
    if run is not None:
        measured, predicted = run_speedups(run)
        spread, flag, noisy = spread_text(run), stored_speedup_flag(run), stored_noisy(run_spread(run))
        when = ""
    else:
        measured = choice.get("measured_whole_run") or choice.get("measured_speedup")
        median, predicted, when = choice.get("measured_speedup"), choice.get("predicted_speedup"), " (when chosen)"
        spread = f"per-prompt median {median:.2f}×" if median else None
        flag, noisy = choice.get("flag"), choice.get("noisy")
    if decided is not None:  # the decision's own prediction, the figure every other place shows for it
        predicted, when = decided, ""
    said = f"predicted {predicted:.2f}×{when}" if predicted else "no prediction stored"
    got = f"measured {measured:.2f}× over the whole run" + (f" ({spread})" if spread else "") if measured else (
        "not measured")  # fmt: skip
    mark = " — impossible (a measurement error)" if flag else " — too noisy to tell" if noisy else ""
    return f"{said}, {got}{mark}"


POLICY_HELP = (
    "Besides the fixed γs, run these drafting policies live, separated by spaces: confidence:P[:NMAX[:NMIN]] "
    "(stop when the draft's confidence falls below P), heuristic:START (transformers' schedule), "
    "adaptive[:C1,C2,..] (SGLang-style EMA). Every policy is replayed from the session anyway (Policies page); "
    "running one live checks the replay. llama.cpp runs fixed γ and confidence:P:NMAX:NMIN only. A quick session "
    "predicts every policy instead and runs the best one live."
)


def policies_suffix(session: Mapping[str, Any]) -> str:
    """' · policies a, b' for a stored session that runs drafting policies live besides its fixed γs, else ''."""
    policies = (session.get("options") or {}).get("policies") or []
    return f" · policies {', '.join(policies)}" if policies else ""


def policy_specs(text: str | None) -> list[str]:
    """The policies typed in the Run form: separated by spaces or ';' (commas belong to adaptive's candidates)."""
    return [part for part in re.split(r"[\s;]+", text or "") if part]


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
    keys = ("tokens_per_s", "draft_acceptance_rate", "tokens_per_call", "steps")
    numbers = {key: progress.get(key) for key in keys}
    if final:
        for key in ("tokens_per_s", "tokens_per_call"):
            if run.get(key) is not None:
                numbers[key] = run[key]
    return numbers


def speed_delta(tps: float | None, base_tps: float | None, flag: str | None = None, basis: str = "") -> str | None:
    """'+50% vs baseline (1.50×)' (`basis` named after the ratio: ' whole run'); a ratio that breaks its
    bound (`flag`) is named impossible, not a gain."""
    if not tps or not base_tps:
        return None
    if flag:
        return f"{tps / base_tps:.2f}×{basis}: impossible"
    return f"{tps / base_tps - 1:+.0%} vs baseline ({tps / base_tps:.2f}×{basis})"  # basis: short, the tile is narrow


def whole_run_speedup(run: Mapping[str, Any]) -> float | None:
    """A finished run's stored speedup over the whole run (tokens/s over every prompt ÷ the baseline's over the
    same prompts; a live policy's under policy_live): the figure the one model predicts and the quick session
    confirms, so a finished run's Tokens/s delta shows that one rather than a third ratio of its own."""
    summary = run.get("summary") or {}
    return summary.get("speedup_whole_run") or (summary.get("policy_live") or {}).get("speedup_whole_run")


@dataclass(frozen=True)
class SpeedCheck:
    """The Tokens/s metric's delta against the baseline, and the bound it breaks (then shown grey, no arrow)."""

    delta: str | None
    flag: str | None

    @property
    def colour(self) -> str:
        return "off" if self.flag else "normal"

    @property
    def arrow(self) -> str:
        return "off" if self.flag else "auto"


def speed_check(run: Mapping[str, Any], now: Mapping[str, Any], base: Mapping[str, Any], final: bool) -> SpeedCheck:
    """The live (or final) tokens/s ratio against the baseline, checked against the one bound a measured speedup
    has (engine.session.summarise.speedup_flag: tokens per call ÷ (v_min + the draft's share)); a finished run's own
    stored verdict (the flag its summary was stored with) counts too."""
    from engine.service.api import speedup_flag, stored_speedup_flag

    tps, base_tps = now.get("tokens_per_s"), base.get("tokens_per_s")
    if run.get("kind") == "baseline" or not tps or not base_tps:
        return SpeedCheck(speed_delta(tps, base_tps) if run.get("kind") != "baseline" else None, None)
    whole = whole_run_speedup(run) if final else None
    ratio, basis = (whole, " whole run") if whole else (tps / base_tps, "")
    flag = stored_speedup_flag(run) if final else None
    flag = flag or speedup_flag(ratio, data.most_drafted(run), now.get("tokens_per_call"),
                                float(run.get("c") or 0.0), None, run.get("verify_cost"))  # fmt: skip
    return SpeedCheck(speed_delta(ratio, 1.0, flag, basis), flag)


def current_run(runs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The running run, else the last one."""
    return next((r for r in reversed(runs) if r.get("status") == "running"), runs[-1])


def run_caption(run: Mapping[str, Any], session: Mapping[str, Any]) -> str:
    """The line above the live numbers (markdown, escaped): 'Current run: … (decoding …)' only while that run
    decodes; otherwise the last run measured and what the session is doing instead (its phase), so a run is
    never called running before its first step, between its prompts while the engine does something else (a
    server starting, v(k) measured), or after the session ended."""
    from app.common import ACTIVE_STATUSES, md_escape

    label, status, phase = md_escape(data.run_label(run)), session.get("status"), session.get("phase") or {}
    if run.get("status") == "done":
        state = "done; tokens/s over the whole run's decoding"
    elif status == "running" and is_decoding(phase):
        return f"Current run: **{label}** (decoding; tokens/s live, over decode-step time)"
    elif status in ACTIVE_STATUSES and _all_decoded(session):
        state = "every prompt decoded; tokens/s live, over decode-step time"
    elif status in ACTIVE_STATUSES:
        state = "paused between prompts; tokens/s live, over decode-step time"
    else:
        state = f"not finished: the session is {status}; tokens/s over the steps it logged"
    now = f" · now: {md_escape(str(phase['name']))}" if status == "running" and phase.get("name") else ""
    return f"Last run measured: **{label}** ({state}){now}"


def _all_decoded(session: Mapping[str, Any]) -> bool:
    return progress_bar(session)[0] >= 1.0


def waiting_text(session: Mapping[str, Any]) -> str:
    """What the live view says before any run has logged a step: the session's phase, never a run."""
    name = str((session.get("phase") or {}).get("name") or "loading models")
    return f"{name[:1].upper()}{name[1:]}… (no run has decoded a token yet)"


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


# ---------------------------------------------------------------------------------------------------------------------
# The live view: poll a cheap version, re-read only what changed, rebuild charts only when new data arrived

POLL_S = 1.0  # while prompts decode: the page follows the store within about a second
LONG_PHASE_POLL_S = 3.0  # loading models, v(k), warm-up, agreement pass, batch sweep, queued: nothing to chart
CHART_EVERY_S = 3.0  # charts are rebuilt at most this often, and only when new steps or samples arrived
UTIL_POINTS = 300  # utilisation samples kept per metric for the chart


NO_CHART = (
    "Per-position acceptance appears once a speculative run logs steps (an engine that logs only each request's "
    "totals gives it, where it counts by position, when the run finishes).",
    "Utilisation appears once the worker samples the device.",
)


def skip_gc_after_each_run() -> None:
    """Turn off Streamlit's full gc.collect() after every script run (runner.postScriptGC), fragment reruns
    included. In the dashboard's process, which has torch and transformers imported (the hardware banner, the
    token view), one full collection costs about 250 ms of CPU: three quarters of a live view's refresh.
    Python's own generational collector still runs. Process-wide, set once."""
    from streamlit import config

    if config.get_option("runner.postScriptGC"):
        config.set_option("runner.postScriptGC", False)


def progress_bar(session: Mapping[str, Any]) -> tuple[float, str]:
    """The session's overall progress bar: (fraction, 'Progress: 3 / 12 prompt decodes (25%) — running')."""
    done, total = session.get("progress_done") or 0, session.get("progress_total") or 0
    fraction = min(1.0, done / total) if total else 0.0
    return fraction, f"Progress: {done} / {total} prompt decodes ({fraction:.0%}) — {session.get('status')}"


def is_decoding(phase: Mapping[str, Any] | None) -> bool:
    return bool(phase) and str(phase.get("name", "")).startswith("decoding")


def poll_interval(status: str | None, phase: Mapping[str, Any] | None) -> float:
    """How often the live fragment reruns: every second while prompts decode, every few seconds in a long
    phase that logs no steps (or while the session waits for a worker)."""
    return POLL_S if status == "running" and (phase is None or is_decoding(phase)) else LONG_PHASE_POLL_S


def fmt_eta(seconds: float | None) -> str | None:
    """'about 40 s', 'about 3 min', 'about 1 h 5 min'; None when unknown."""
    if seconds is None:
        return None
    seconds = max(0.0, float(seconds))
    if seconds < 5:
        return "a few seconds"
    if seconds < 90:
        return f"about {seconds:.0f} s"
    if seconds < 3600:
        return f"about {seconds / 60:.0f} min"
    return f"about {int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def phase_text(phase: Mapping[str, Any] | None, status: str | None = None, now: float | None = None) -> str | None:
    """'Phase: decoding prompt 3 of 8 — 17 / 40 (42%), about 1 min left' (at Unix time `now`, by default the
    clock's: phase_eta); for a session that has ended, the phase it stopped in ('Stopped during: …'), or None when it
    finished (its banner says so) or there is no phase."""
    if not phase or not phase.get("name"):
        return None
    name = str(phase["name"])
    if status not in (None, "queued", "running"):
        return None if name == "done" else f"Stopped during: {name}"
    done, total = int(phase.get("done") or 0), int(phase.get("total") or 0)
    parts = [f"Phase: {name}"]
    if total > 1 and name != "done" and not is_decoding(phase):  # decoding counts the progress bar's prompt decodes
        parts.append(f"{done} / {total} ({min(1.0, done / total):.0%})")
    eta = phase_eta(phase, now) if status in (None, "running") and name != "done" else None
    text = " — ".join(parts)
    return f"{text}, {eta}" if eta else text


def phase_eta(phase: Mapping[str, Any], now: float | None = None) -> str | None:
    """The phase's time left, counted down from when the worker estimated it (its `at`, Unix seconds) to `now`:
    'about 90 s left'; once that time has passed, 'taking longer than estimated (about 2 min)', never the stale
    figure. None when there is no estimate."""
    eta = phase.get("eta_s")
    if eta is None or float(eta) <= 0:
        return None
    at = phase.get("at")
    if at is None:
        return f"{fmt_eta(eta)} left"
    passed = max(0.0, (time.time() if now is None else now) - float(at))
    if passed < float(eta):
        return f"{fmt_eta(float(eta) - passed)} left"
    return f"taking longer than estimated ({fmt_eta(eta)})"


def phase_fraction(phase: Mapping[str, Any] | None) -> float:
    if not phase:
        return 0.0
    done, total = int(phase.get("done") or 0), int(phase.get("total") or 0)
    return 1.0 if phase.get("name") == "done" else (min(1.0, done / total) if total else 0.0)


def _totals_numbers(totals: Mapping[str, Any] | None) -> dict[str, Any]:
    """run_progress-style rates from summed step columns."""
    if not totals:
        return {"steps": 0}
    busy = totals["draft_time_s"] + totals["verify_time_s"]
    return {
        "steps": totals["steps"],
        "tokens_per_s": totals["emitted"] / busy if busy > 0 else None,
        "draft_acceptance_rate": draft_acceptance_rate(totals["proposed"], totals["accepted"]),
        "tokens_per_call": tokens_per_call(totals["emitted"], totals["target_calls"]),
    }


@dataclass
class LiveFrame:
    """What one refresh of the live view draws; ``charts_rebuilt`` says whether the charts are new."""

    session: Mapping[str, Any] | None
    runs: list[Mapping[str, Any]]
    current: Mapping[str, Any] | None
    baseline: Mapping[str, Any] | None
    now: dict[str, Any]
    base: dict[str, Any]
    positions_spec: dict[str, Any] | None
    util_spec: dict[str, Any] | None
    latest: tuple[Mapping[str, Any], Mapping[str, Any]] | None
    other_cpu_pct: float | None
    charts_rebuilt: bool


class LiveCache:
    """A session's live view state kept between refreshes (one per browser tab, in st.session_state).

    Each refresh reads ``store.live_version`` (a few small queries). Only what changed is read again: the
    session row when its state changed, the runs when one started or finished, the steps logged since the
    last refresh (summed per run, so old steps are never re-read), the newest output when there is a new one,
    utilisation samples since the last one. Charts are rebuilt, as ready-to-send Vega-Lite specs, only when
    new steps or samples arrived and at most every ``chart_every_s``; otherwise the cached specs are sent again.
    """

    def __init__(self, session_id: int, chart_every_s: float = CHART_EVERY_S) -> None:
        self.session_id = session_id
        self.chart_every_s = chart_every_s
        self.version: Any = None
        self.session: dict[str, Any] | None = None
        self._state_key: Any = None
        self.runs: list[dict[str, Any]] = []
        self._runs_key: Any = None
        self.after_step_id: int | None = None  # the newest of this session's steps summed so far
        self._newest_seen: int | None = None
        self.totals: dict[int, dict[str, Any]] = {}
        self.histogram: dict[int, dict[tuple[int, int], int]] = {}
        self.last_run_id: int | None = None
        self._outputs_seen = -1
        self.latest_output: dict[str, Any] | None = None
        self.samples: list[dict[str, Any]] = []
        self._samples_t: float | None = None
        self._charts_at: float | None = None
        self._steps_key = 0  # steps summed so far: the charts change when it does
        self._charted: Any = None
        self.positions_spec: dict[str, Any] | None = None
        self.util_spec: dict[str, Any] | None = None
        self.chart_builds = 0  # how many times the charts were rebuilt (the tests count it)

    def refresh(self, store: Any, now: float) -> LiveFrame:
        version = store.live_version(self.session_id, count_steps=False)  # steps are summed here, not counted
        self.version = version["version"]
        state_key = version["version"][1]
        if state_key != self._state_key or self.session is None:
            self.session = store.get_session(self.session_id)
            self._state_key = state_key
        runs_key = (version["runs"], version["runs_done"])
        if runs_key != self._runs_key:
            self.runs = store.list_runs(self.session_id)
            self._runs_key = runs_key
        newest = version["newest_step_id"]  # moves when any session logs a step: then read what is ours
        if newest is not None and newest != self._newest_seen:
            self._add_steps(store.step_totals_since(self.session_id, self.after_step_id))
            self._newest_seen = newest
        if version["outputs"] != self._outputs_seen:
            self.latest_output = store.latest_output(self.session_id) if version["outputs"] else None
            self._outputs_seen = version["outputs"]
        rebuilt = self._maybe_rebuild_charts(store, now, version["data_version"])
        return self._frame(rebuilt)

    def _add_steps(self, new: Mapping[str, Any]) -> None:
        for run_id, totals in new["runs"].items():
            mine = self.totals.setdefault(run_id, dict.fromkeys(totals, 0))
            for key, value in totals.items():
                mine[key] += value
        for run_id, rows in new["histogram"].items():
            counts = self.histogram.setdefault(run_id, {})
            for gamma, accepted, n in rows:
                counts[(gamma, accepted)] = counts.get((gamma, accepted), 0) + n
        if new["last_run_id"] is not None:
            self.last_run_id = new["last_run_id"]
        self.after_step_id = new["max_step_id"]
        self._steps_key = sum(t["steps"] for t in self.totals.values())

    def _maybe_rebuild_charts(self, store: Any, now: float, data_version: Any) -> bool:
        same_run = self._charted is not None and self._charted[3] == self.current_run_id()
        if same_run and self._charts_at is not None and now - self._charts_at < self.chart_every_s:
            return False  # a new current run is charted at once: the chart is always of the run beside it
        new_samples = store.utilisation_series(self.session_id, since_t=self._samples_t, max_points=UTIL_POINTS)
        if new_samples:
            self.samples = _thin([*self.samples, *new_samples], UTIL_POINTS)
            self._samples_t = float(new_samples[-1]["t"])
        key = (self._steps_key, data_version[3:], self._samples_t, self.current_run_id())
        if key == self._charted:
            self._charts_at = now  # nothing new: look again after chart_every_s
            return False
        from app import charts

        current = self.current_run()
        positions = None
        if current is not None and current.get("kind") == "speculative":
            positions = live_positions(store, current, self.histogram.get(current["id"], {}))
        self.positions_spec = (
            charts.vega_spec(charts.acceptance_by_position(positions))
            if positions is not None and not positions.empty
            else None
        )
        util = data.utilisation_long(self.samples)
        self.util_spec = charts.vega_spec(charts.utilisation(util)) if not util.empty else None
        self._charted, self._charts_at = key, now
        self.chart_builds += 1
        return True

    def current_run_id(self) -> int | None:
        current = self.current_run()
        return current["id"] if current is not None else None

    def current_run(self) -> Mapping[str, Any] | None:
        """The run that logged the newest step (every run is open at once in an interleaved sweep), else the
        last run that logged one or finished; None before any run has logged a step."""
        by_id = {r["id"]: r for r in self.runs}
        if self.last_run_id in by_id:
            return by_id[self.last_run_id]
        started = [r for r in self.runs if r["id"] in self.totals or r.get("status") == "done"]
        return started[-1] if started else None  # none before a run logs its first step

    def _frame(self, rebuilt: bool) -> LiveFrame:
        current = self.current_run()
        baseline = compared_baseline(self.runs, current)

        def numbers(run: Mapping[str, Any] | None) -> dict[str, Any]:
            if run is None:
                return {}
            final = run.get("status") == "done" and current is not None and current.get("status") == "done"
            return live_numbers(run, _totals_numbers(self.totals.get(run["id"])), final)

        latest = None
        if self.latest_output is not None:
            run = next((r for r in self.runs if r["id"] == self.latest_output.get("run_id")), None)
            latest = (run, self.latest_output) if run is not None else None
        other = next(
            (s["metrics"].get("other_cpu_pct") for s in reversed(self.samples) if "other_cpu_pct" in s["metrics"]),
            None,
        )
        return LiveFrame(
            session=self.session, runs=self.runs, current=current, baseline=baseline, now=numbers(current),
            base=numbers(baseline), positions_spec=self.positions_spec, util_spec=self.util_spec, latest=latest,
            other_cpu_pct=other, charts_rebuilt=rebuilt,
        )  # fmt: skip


def live_positions(store: Any, run: Mapping[str, Any], counts: Mapping[tuple[int, int], int]) -> Any:
    """The per-position chart's frame, in the convention of engine.core.counters' glossary (the conditional rate:
    accepted at p ÷ drafts that reached p) from the run's single steps; where the engine logs only a request's
    totals (no step says which position was accepted), the per-position rates the finished run was stored with.
    Never more positions than the run drafts in a step (its γ; a policy: its widest draft)."""
    rows = store.positions_from_histogram([(g, a, n) for (g, a), n in counts.items()])
    if not rows and run.get("status") == "done":
        rows = [{"position": p, "rate": rate, "evaluated": None}
                for p, rate in enumerate(run.get("per_position_acceptance") or [])]  # fmt: skip
    top = data.most_drafted(run)
    return data.positions_frame([r for r in rows if not top or int(r["position"]) < top])


def _thin(samples: list[dict[str, Any]], per_source: int) -> list[dict[str, Any]]:
    """At most about ``per_source`` samples per source, evenly kept (every other one, as often as needed)."""
    while True:
        counts: dict[Any, int] = {}
        for s in samples:
            counts[s.get("source")] = counts.get(s.get("source"), 0) + 1
        if not counts or max(counts.values()) <= per_source:
            return samples
        samples = samples[::2] if len(counts) == 1 else _halve_by_source(samples)


def _halve_by_source(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[Any, int] = {}
    kept = []
    for s in samples:
        n = seen.get(s.get("source"), 0)
        seen[s.get("source")] = n + 1
        if n % 2 == 0:
            kept.append(s)
    return kept


def live_cache(state: Any, session_id: int) -> LiveCache:
    """The tab's LiveCache for this session (a new one when the tab watches another session)."""
    cache = state.get("run_live_cache")
    if not isinstance(cache, LiveCache) or cache.session_id != session_id:
        cache = LiveCache(session_id)
        state["run_live_cache"] = cache
    return cache


def busy_note(session: Mapping[str, Any], other_cpu_pct: float | None = None) -> str | None:
    """The busy-machine warning: the finished session's own note, or while it runs, the latest reading of
    other processes' CPU share when it is above the busy threshold."""
    from engine.service.api import BUSY_OTHER_CPU_PCT

    note = (session.get("summary") or {}).get("machine_note")
    if note:
        return str(note)
    if session.get("status") == "running" and other_cpu_pct is not None and other_cpu_pct >= BUSY_OTHER_CPU_PCT:
        return (
            f"The machine is busy: other processes are using {other_cpu_pct:.0f}% of its CPUs right now. Each "
            "speedup is measured side by side, prompt by prompt, but expect a wider spread than on a quiet machine."
        )
    return None


def measurement_costs(
    sessions: Sequence[Mapping[str, Any]], target: str, dtype: str, max_gamma: int, serving_batch: int
) -> dict[str, Any]:
    """Seconds the optional measurements are likely to take on this machine: {"verify": s, "regime": s,
    "source": text}. From the newest finished session with this target and dtype: its measured phase times,
    else estimates from its baseline's step time; None where nothing is known yet."""
    from engine.service.api import batch_sweep_eta_s, verify_cost_eta_s

    for session in sessions:
        summary = session.get("summary") or {}
        if session.get("status") != "done" or session.get("target") != target or session.get("dtype") != dtype:
            continue
        times = summary.get("phase_times_s") or {}
        tps = summary.get("baseline_tokens_per_s")
        step = 1.0 / tps if tps else None
        verify = times.get("measuring v(k)")
        regime = times.get("batch sweep")
        if verify is None and regime is None and step is None:
            continue
        return {
            "verify": verify if verify is not None else verify_cost_eta_s(step, max_gamma),
            "regime": regime if regime is not None else batch_sweep_eta_s(step, serving_batch),
            "source": f"session #{session.get('id')}",
        }
    return {"verify": None, "regime": None, "source": None}


def cost_caption(seconds: float | None, source: str | None) -> str:
    """'about 2 min on this machine (from session #4)', or what is known when nothing was measured yet."""
    if seconds is None:
        return "cost unknown until a session with this target has run here"
    return f"{fmt_eta(seconds)} on this machine (from {source})"


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


def cost_captions(
    sessions: Sequence[Mapping[str, Any]], target: str, dtype: str, state: Mapping[str, Any]
) -> tuple[str, str]:
    """The costs stated next to the v(k) and regime switches, for the γ values and serving batch in the form."""
    typed = (state.get("gammas_text") or "").strip()
    try:
        gammas = data.parse_int_list(typed, "γ") if typed else list(state.get("gammas_choice") or [])
    except SettingsError:
        gammas = []
    costs = measurement_costs(sessions, target, dtype, max(gammas or [4]), int(state.get("serving_batch") or 1))
    return (
        f"v(k): {cost_caption(costs['verify'], costs['source'])}",
        f"batch sweep: {cost_caption(costs['regime'], costs['source'])}",
    )
