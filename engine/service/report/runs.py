"""A stored session's runs as the shareable report shows them: one RunFigures per run, read from the store's rows.

The figures are the stored ones the Sessions page shows (app.data and app.sessions_view read runs through the
functions here: label, speedups, spread, verdict): a policy run's speedups are its live ones, the spread and
noise verdict are the run's per-prompt speedups, and a flag says which physical bound (engine.analysis.bounds) a
figure breaks — the recommender's own flag where the run is one it read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.analysis.bounds import check_tokens_per_call
from engine.core.policy import parse_policy
from engine.measure.noise import stored_noisy
from engine.session.summarise import run_speedup, run_spread, spread_above_bound, stored_speedup_flag

VERDICT_LABELS = {
    "identical": "identical",
    "near-tie": "numerical near-tie",
    "bug": "bug",
    "not-applicable": "not applicable (sampled)",
}
FlagKey = tuple[str, float, int]  # (draft, temperature, γ)


@dataclass
class RunFigures:
    """One run's row in the report."""

    label: str
    kind: str
    draft: str
    gamma: int | None  # None for a policy run
    policy: str | None
    temperature: float | None
    status: str
    alpha: float | None
    tokens_per_call: float | None  # tokens per target call
    draft_acceptance_rate: float | None
    c: float | None
    tokens_per_s: float | None
    baseline_tokens_per_s: float | None
    speedup_measured: float | None
    speedup_predicted: float | None
    spread: dict[str, Any] | None  # per-prompt speedups: median, min, max, n, verdict
    verdict: str | None
    per_position_acceptance: list[float] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    fidelity: str = ""
    spread_words: str | None = None  # spread_text: lowest–highest, the median, a prompt above its bound


def run_concurrency(run: Mapping[str, Any]) -> int:
    """Requests in flight while the run was measured (1 for an engine that decodes one at a time)."""
    try:
        return int((run.get("summary") or {}).get("concurrency") or 1)
    except (TypeError, ValueError):
        return 1


def run_policy(run: Mapping[str, Any]) -> str | None:
    return run.get("policy") or (run.get("summary") or {}).get("policy")


def run_label(run: Mapping[str, Any]) -> str:
    """'draft γ=2 T=0' (×N at N requests in flight), 'draft policy P T=0', or 'baseline (target alone)'."""
    level = run_concurrency(run)
    at = f" ×{level}" if level != 1 else ""
    if run.get("kind") == "baseline":
        return f"baseline (target alone){at}"
    policy = run_policy(run)
    how = f"policy {policy}" if policy else f"γ={run.get('gamma')}"
    return f"{run.get('draft')} {how} T={_num(run.get('temperature'))}{at}"


def _num(value: Any) -> str:
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return str(value)


def run_speedups(run: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(measured, predicted): the run's one measured speedup (engine.session.summarise.run_speedup: over the whole
    run, what its bound check judges), and the prediction; a policy run's are its live figure and what the replay
    predicted."""
    live = (run.get("summary") or {}).get("policy_live") if run_policy(run) else None
    predicted = (live.get("replayed") or {}).get("speedup") if live else run.get("speedup_predicted")
    return run_speedup(run), predicted


def spread_text(run: Mapping[str, Any]) -> str | None:
    """The run's per-prompt speedups in words: '0.80–2.61× (median 1.10×)', with '⚠ prompt 3 above its bound
    (2.61× > 1.05×)' where a prompt's ratio breaks that prompt's own bound; None without a spread."""
    spread = run_spread(run)
    if spread is None:
        return None
    text = f"{spread['min']:.2f}–{spread['max']:.2f}× (median {spread['median']:.2f}×)"
    above = spread_above_bound(run)
    return f"{text} {above_text(above)}" if above else text


def above_text(above: Sequence[Mapping[str, Any]]) -> str:
    """'⚠ prompt 3 above its bound (2.61× > 1.05×)', '⚠ prompts 2, 3 above their bounds', or for a run stored
    without per-prompt bounds '⚠ highest prompt above γ+1 (…)'."""
    if len(above) == 1:
        one = above[0]
        who = f"prompt {int(one['prompt'])} above its bound" if one.get("prompt") else "highest prompt above its bound"
        return f"⚠ {who} ({float(one['speedup']):.2f}× > {float(one['bound']):.2f}×): impossible"
    numbers = ", ".join(str(int(x["prompt"])) for x in above)
    return f"⚠ prompts {numbers} above their bounds: impossible"


def configuration_run(
    runs: Sequence[Mapping[str, Any]], draft: str, gamma: int, temperature: float, policy: str | None = None
) -> Mapping[str, Any] | None:
    """The newest finished run of one configuration at one request in flight (a policy's under its policy, a
    fixed γ's under its γ): the stored row the Sessions page shows for it; None when none finished."""
    for run in reversed(runs):
        if run.get("kind") == "baseline" or run.get("status", "done") != "done" or run_concurrency(run) != 1:
            continue
        same = run_policy(run) == policy if policy else not run_policy(run) and int(run.get("gamma") or 0) == gamma
        if same and run.get("draft") == draft and abs(float(run.get("temperature") or 0.0) - temperature) < 1e-9:
            return run
    return None


def noise_verdict(spread: Mapping[str, Any]) -> str:
    """The spread's verdict, '(noisy)' added where engine.measure.noise.is_noisy says it spreads too widely, and how
    many prompts it left out (above their bound)."""
    verdict = str(spread.get("verdict") or "")
    verdict = f"{verdict} (noisy)" if stored_noisy(spread) and verdict in ("faster", "slower") else verdict
    dropped = int(spread.get("dropped") or 0)
    if dropped:
        n = int(spread.get("n") or 0)
        verdict += f" ({dropped} of {n + dropped} prompts above their bound left out)"
    return verdict


IMPOSSIBLE = "impossible (a measurement error)"


def run_verdict(run: Mapping[str, Any]) -> str | None:
    """The verdict on a run's measured speedup: impossible where it breaks its bound (the flag it was stored
    with), else the noise verdict of its per-prompt spread; None without a spread."""
    spread = run_spread(run)
    if spread is None:
        return None
    return IMPOSSIBLE if stored_speedup_flag(run) else noise_verdict(spread)


def compared_baseline(runs: Sequence[Mapping[str, Any]], run: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The target-alone run `run` was compared with: the newest baseline at its temperature and concurrency started
    before it (a confirmation brings its own, measured beside it; a baseline is its own), else the first baseline
    at its temperature, else the session's first."""
    bases = [r for r in runs if r.get("kind") == "baseline"]
    if run is None:
        return bases[0] if bases else None
    warm = [r for r in bases if r.get("temperature") == run.get("temperature")]
    same = [
        r
        for r in warm
        if run_concurrency(r) == run_concurrency(run)
        and (r.get("id") is None or run.get("id") is None or r["id"] <= run["id"])
    ]
    if same:
        return same[-1]
    return (warm or bases or [None])[0]


def baseline_tps(runs: Sequence[Mapping[str, Any]], run: Mapping[str, Any]) -> float | None:
    """The tokens/s of the target alone `run` was compared with (compared_baseline)."""
    base = compared_baseline(runs, run)
    return base.get("tokens_per_s") if base else None


def bound_flags(run: Mapping[str, Any], recommender: Mapping[FlagKey, str]) -> list[str]:
    """Which bounds the run's figures break: tokens per call ≤ γ+1, and the measured speedup ≤ tokens per call ÷
    (v_min + the draft's share of a call, c · draft forwards per step) — the recommender's flag where it has one, else
    the flag the run was stored with (engine.session.summarise.stored_speedup_flag)."""
    if run.get("kind") == "baseline":
        return []
    summary = run.get("summary") or {}
    policy, live = run_policy(run), summary.get("policy_live") or {}
    gamma = parse_policy(policy).max_draft() if policy else int(run.get("gamma") or 0)
    per_call = live.get("tokens_per_call") if policy else run.get("tokens_per_call")
    measured = run_speedups(run)[0]
    flags = []
    if per_call is not None and gamma >= 1 and (flag := check_tokens_per_call(float(per_call), gamma)) is not None:
        flags.append(flag.message)
    key = (str(run.get("draft")), float(run.get("temperature") or 0.0), gamma)
    if not policy and run_concurrency(run) == 1 and key in recommender:
        return [*flags, recommender[key]]
    if measured and (flag := stored_speedup_flag(run)) is not None:
        flags.append(flag)
    if above := spread_above_bound(run):
        flags.append(
            f"per-prompt spread: {above_text(above)} — a prompt's ratio above that prompt's tokens per call "
            "÷ (v_min + the draft's share) is a measurement error, never a result"
        )
    return flags


def fidelity_counts(outputs: Sequence[Mapping[str, Any]]) -> str:
    """'3 identical, 1 bug' from the outputs' divergence verdicts against the baseline."""
    counts: Counter[str] = Counter()
    for output in outputs:
        div = output.get("divergence") or {}
        verdict = div.get("verdict") or ("identical" if div.get("identical") else "unknown")
        counts[VERDICT_LABELS.get(verdict, verdict)] += 1
    return ", ".join(f"{n} {label}" for label, n in counts.most_common())


def run_figures(
    runs: Sequence[Mapping[str, Any]],
    outputs_by_run: Mapping[int, Sequence[Mapping[str, Any]]],
    recommender: Mapping[FlagKey, str],
) -> list[RunFigures]:
    """Every run of a session, in the store's order."""
    rows = []
    for r in runs:
        policy, spread = run_policy(r), run_spread(r)
        measured, predicted = run_speedups(r)
        speculative = r.get("kind") != "baseline"
        rows.append(
            RunFigures(
                label=run_label(r),
                kind=str(r.get("kind")),
                draft=str(r.get("draft")),
                gamma=None if policy else r.get("gamma"),
                policy=policy,
                temperature=r.get("temperature"),
                status=str(r.get("status")),
                alpha=r.get("alpha"),
                tokens_per_call=r.get("tokens_per_call"),
                draft_acceptance_rate=(r.get("summary") or {}).get("draft_acceptance_rate"),
                c=r.get("c"),
                tokens_per_s=r.get("tokens_per_s"),
                baseline_tokens_per_s=r.get("baseline_tokens_per_s") or baseline_tps(runs, r),
                speedup_measured=measured,
                speedup_predicted=predicted,
                spread=spread,
                verdict=run_verdict(r),
                per_position_acceptance=[float(x) for x in r.get("per_position_acceptance") or []],
                flags=bound_flags(r, recommender),
                fidelity=fidelity_counts(outputs_by_run.get(r["id"], [])) if speculative else "",
                spread_words=spread_text(r),
            )
        )
    return rows
