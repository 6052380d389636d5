"""A walk through every page in a real browser: speedups within their bounds, "off" names no γ, page γ = export γ.

Issue #21: sessions are made the way a user makes them (`python -m engine submit`, then `python -m engine
worker --once`): one in spectune's PyTorch loop (a tiny target, a noisy tiny draft and n-gram, γ 1 and 3, with
the batch sweep) and one real llama.cpp session (the bundled smollm2-135m with n-gram, γ 2 and 4). The dashboard
is started on that data directory and headless Chromium opens Home, Prompts, Run, Sessions, Theory, Recommend,
Endpoints and Policies (with ?session= for each session where the page takes one). On each page, from what the
browser rendered (text, metrics, every table's cells, the export code blocks), once Streamlit's script has
finished and every table and chart has drawn (not a fixed sleep):

* every speedup shown beside a tokens-per-call figure (mean acceptance length, tokens per call, tokens/call) is
  at most that figure: exactly for a table's predictions, within the engine's 5% slack for its measurements
  (engine.analysis.bounds.MEASURED_SLACK; text and metrics, which do not say which they are, get the slack);
  every speedup beside its γ is at most γ+1 (Theorem 3.8's single-α reference column only that: it is not a
  function of the row's tokens per call); unless the row, line or metric carries a visible bound flag (⚠,
  "measurement error", "impossible", "model error"; a noise verdict is not one);
* a page that says "Speculation OFF" names no recommended γ anywhere ("recommended γ=", "◀ recommended",
  "◀ best", a γ metric other than "0 (off)"), and its exports turn speculation off;
* the γ the Recommend page recommends equals num_speculative_tokens in the vLLM export and the llama.cpp export's
  n-max (--spec-draft-n-max, or --spec-ngram-simple-size-m for n-gram): both as the page shows them, as its
  download buttons hand them out, and as the service call the page makes (recommend_and_export) returns them;
* on the Sessions pages, at 1400 px and before any sideways scroll: the runs table's measured speedup, its bound,
  verdict and prediction, and the History table's best speedup, each header whole.

OFF is also forced through the page's own inputs (objective "Cost per token", regime "compute-bound").
Defects found and reported but not fixed yet are listed in KNOWN_DEFECTS: a test whose only problems are those
is an expected failure (xfail, not strict: most of them need a loaded machine to show), anything else fails it.
Screenshots go to artifacts/walk/. The text checks are plain functions, each tested on planted violations below.
Needs Debian's chromium (`make browser`) and the llama.cpp build (`make setup`); skipped when either is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts" / "walk"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
VIEWPORT = {"width": 1400, "height": 1000}  # the narrow screen every check runs on
WIDE = 1920  # each page is also shot at this width
BAND_SLACK = 0.05  # engine.analysis.recommend_types.BAND_SLACK: a prediction this far outside a measured band agrees
TARGET, DRAFT = "tiny:1:48:2:64", "tiny:1:48:2:64~0.15"
LLAMA_TARGET = "smollm2-135m"
TIMEOUT_MS = 120_000
MEASURED_SLACK = 0.05  # engine.analysis.bounds.MEASURED_SLACK: measurements may exceed a bound by 5%
ROUNDING = 0.005  # a figure shown with two decimals
PROMPTS = (
    "write a short note about the sea and the sea.\n"
    "list three colours of the rainbow, then list them again.\n"
    "the cat sat on the mat; the cat sat on the mat; the cat\n"
)

# ----------------------------------------------------------------------------------------------------------------------
# reading what the page shows: pure functions over text, tables and metrics (tested on planted violations below)

NUMBER = r"(\d+(?:\.\d+)?)"
SPEEDUP_RE = re.compile(NUMBER + r"\s?×")
TPC_TEXT_RES = (
    re.compile(NUMBER + r"\s+tokens per (?:target )?call"),
    re.compile(r"(?:mean acceptance length|tokens per (?:target )?call|tokens/call)[\s:=]+" + NUMBER, re.I),
)
GAMMA_RE = re.compile(r"γ\s?=\s?(\d+)")
NOT_A_SPEEDUP = re.compile(r"(multiplier|ops|cost|more|arithmetic|×\s?the target alone)\W*$", re.I)
FLAG_RE = re.compile(r"⚠|measurement error|model error|impossible", re.I)  # a bound flag; a noise verdict is not
OFF_RE = re.compile(r"Speculation OFF")
RECOMMENDED_GAMMA_RES = (
    re.compile(r"recommended\s+γ\s?=\s?\d+", re.I),
    re.compile(r"◀\s?recommended"),
    re.compile(r"◀\s?best"),
)
TPC_HEADER = re.compile(r"tokens per call|mean acceptance length|tokens/call|tokens per target call", re.I)
MEASURED_HEADER = re.compile(r"measured|live", re.I)
REFERENCE_HEADER = re.compile(r"reference|one α|Thm 3\.8|paper", re.I)


def _float(cell: str) -> float | None:
    match = re.search(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", cell or "")
    return float(match.group(0)) if match else None


def text_speedups(line: str) -> list[float]:
    """The N.NN× speedups in a line of text (an ops multiplier, '2.1× more' arithmetic or cost × are not)."""
    found = []
    for m in SPEEDUP_RE.finditer(line):
        before, after = line[max(0, m.start() - 24) : m.start()], line[m.end() : m.end() + 12]
        if NOT_A_SPEEDUP.search(before) or re.match(r"\s?(more|the target alone)", after):
            continue
        found.append(float(m.group(1)))
    return found


def text_violations(lines: Iterable[str]) -> list[str]:
    """Lines whose speedup exceeds the tokens per call (or γ+1) they name, without a visible flag."""
    bad = []
    for line in lines:
        if FLAG_RE.search(line):
            continue
        speedups = text_speedups(line)
        if not speedups:
            continue
        tpcs = [float(m.group(1)) for rx in TPC_TEXT_RES for m in rx.finditer(line)]
        gammas = {int(g) for g in GAMMA_RE.findall(line)}
        for s in speedups:
            if tpcs and s > max(tpcs) * (1 + MEASURED_SLACK) + ROUNDING:
                bad.append(f"{s:.2f}× beside {max(tpcs):.2f} tokens per call: {line!r}")
            if len(gammas) == 1 and s > next(iter(gammas)) + 1 + ROUNDING:
                bad.append(f"{s:.2f}× at γ={next(iter(gammas))}, above γ+1: {line!r}")
    return bad


@dataclass
class Grid:
    """One table as the browser's data grid shows it (its accessibility tree: every cell's text)."""

    head: list[str]
    rows: list[list[str]]
    rowcount: int = 0  # rows the grid says it has (without the header)

    def column(self, row: Sequence[str], name: str) -> str:
        return row[self.head.index(name)] if name in self.head else ""


def _pair_tpc(head: Sequence[str], speedup: str) -> str | None:
    """The tokens-per-call column a speedup column is read against: the live one for a live speedup, else the
    first other one."""
    tpcs = [h for h in head if TPC_HEADER.search(h)]
    live = "live" in speedup.lower()
    same = [h for h in tpcs if ("live" in h.lower()) == live]
    return same[0] if same else None


def _gamma_column(head: Sequence[str], speedup: str) -> str | None:
    """The γ a speedup column is at: 'at γ' for a measured one beside a 'best γ', else 'γ'/'best γ'."""
    if MEASURED_HEADER.search(speedup) and "at γ" in head:
        return "at γ"
    for name in ("γ", "best γ"):
        if name in head:
            return name
    return None


def grid_violations(grid: Grid) -> list[str]:
    """Rows where a speedup exceeds its tokens per call (or its γ+1) and no cell of the row carries a flag."""
    bad = []
    speedups = [h for h in grid.head if re.search(r"speedup|^latency$", h, re.I) or REFERENCE_HEADER.search(h)]
    for row in grid.rows:
        if any(FLAG_RE.search(cell or "") for cell in row):
            continue
        for name in speedups:
            value = _float(grid.column(row, name))
            if value is None:
                continue
            measured = bool(MEASURED_HEADER.search(name))
            slack = MEASURED_SLACK if measured else 0.0
            tpc_name = None if REFERENCE_HEADER.search(name) else _pair_tpc(grid.head, name)
            tpc = _float(grid.column(row, tpc_name)) if tpc_name else None
            if tpc is not None and value > tpc * (1 + slack) + ROUNDING:
                bad.append(f"{name} {value:.2f}× above {tpc_name} {tpc:.2f} in row {row}")
            gamma_name = _gamma_column(grid.head, name)
            gamma = _float(grid.column(row, gamma_name)) if gamma_name else None
            if gamma is not None and value > (gamma + 1) * (1 + slack) + ROUNDING:
                bad.append(f"{name} {value:.2f}× above γ+1 = {gamma + 1:g} in row {row}")
    return bad


@dataclass
class Metric:
    label: str
    value: str
    delta: str = ""


def metric_violations(groups: Iterable[Sequence[Metric]]) -> list[str]:
    """A row of metrics with a tokens-per-call metric: each speedup in the row (value or delta) at most it."""
    bad = []
    for group in groups:
        tpc = [_float(m.value) for m in group if TPC_HEADER.search(m.label)]
        tpc = [t for t in tpc if t is not None]
        if not tpc or any(FLAG_RE.search(f"{m.label} {m.value} {m.delta}") for m in group):
            continue
        for m in group:
            for s in text_speedups(f"{m.value} {m.delta}") if not NOT_A_SPEEDUP.search(m.label + " ") else []:
                if s > tpc[0] * (1 + MEASURED_SLACK) + ROUNDING:
                    bad.append(f"{m.label} {s:.2f}× above {tpc[0]:.2f} tokens per call in {group}")
    return bad


@dataclass
class Snapshot:
    """What one page showed."""

    name: str
    text: str
    lines: list[str] = field(default_factory=list)  # text blocks, one line each
    grids: list[Grid] = field(default_factory=list)
    metrics: list[list[Metric]] = field(default_factory=list)
    codes: list[str] = field(default_factory=list)

    @property
    def off(self) -> bool:
        return bool(OFF_RE.search(self.text))

    def everything(self) -> list[str]:
        cells = [cell for g in self.grids for row in g.rows for cell in row]
        return [self.text, *self.lines, *cells, *self.codes, *(f"{m.label} {m.value} {m.delta}" for g in self.metrics
                                                            for m in g)]  # fmt: skip


def bound_violations(snap: Snapshot) -> list[str]:
    return [
        *text_violations(snap.lines),
        *(v for g in snap.grids for v in grid_violations(g)),
        *metric_violations(snap.metrics),
    ]


def off_violations(snap: Snapshot) -> list[str]:
    """On a page that says speculation is OFF: every place that still names a recommended γ."""
    if not snap.off:
        return []
    bad = []
    for piece in snap.everything():
        for rx in RECOMMENDED_GAMMA_RES:
            for m in rx.finditer(piece):
                bad.append(f"{m.group(0)!r} in {piece[max(0, m.start() - 80) : m.end() + 80]!r}")
    for group in snap.metrics:
        for m in group:
            if m.label == "γ" and "off" not in m.value:
                bad.append(f"the γ metric says {m.value!r}")
    return bad


HEADLINE_RE = re.compile(r"(\S+) with γ = (\d+): (predicted|measured) (\d+(?:\.\d+)?)×")


@dataclass
class MeasuredRun:
    """A stored run of one configuration (greedy, one request at a time): its whole-run speedup and its noise band
    (its prompts' ratios, widened to take in the whole-run speedup)."""

    draft: str
    gamma: int
    whole: float
    low: float
    high: float


def headline_violations(text: str, measured: Sequence[MeasuredRun]) -> list[str]:
    """A headline ('DRAFT with γ = G: predicted X×' or 'measured X×') whose configuration was measured: the page
    must show that measurement ('measured M×', M the whole run's), and where the headline's figure lies outside the
    measurement's band (beyond BAND_SLACK) it must say the two disagree."""
    bad = []
    for m in HEADLINE_RE.finditer(text):
        draft, gamma, figure = m.group(1), int(m.group(2)), float(m.group(4))
        runs = [r for r in measured if r.draft == draft and r.gamma == gamma]
        if not runs:
            continue
        said = [r for r in runs if f"measured {r.whole:.2f}×" in text]
        if not said:
            found = ", ".join(f"{r.whole:.2f}×" for r in runs)
            bad.append(f"headline {m.group(0)!r}: this configuration measured {found}, not shown beside it")
            continue
        run = said[0]
        if f"measured {run.whole:.2f}×, impossible" in text:  # thrown out as a measurement error: no band to be in
            continue
        inside = run.low * (1 - BAND_SLACK) - ROUNDING <= figure <= run.high * (1 + BAND_SLACK) + ROUNDING
        if not inside and "beyond the noise" not in text:
            bad.append(f"headline {m.group(0)!r} outside the measured {run.whole:.2f}× (band {run.low:.2f}–"
                       f"{run.high:.2f}×) without saying so")  # fmt: skip
    return bad


def decision_violations(text: str, headline: str, measured: bool) -> list[str]:
    """The page against the stored decision (engine.service.decide.decisions): its headline shown once, word for
    word, and
    measured or saying "not measured"; no other configuration called the decision."""
    flat = " ".join(text.split())
    bad = []
    shown = flat.count(f"Decision: {' '.join(headline.split())}")
    if shown != 1:
        bad.append(f"the stored decision is shown {shown} times, not once: {headline!r}")
    if not measured and "not measured" not in headline:
        bad.append(f"an unmeasured decision does not say so: {headline!r}")
    others = [d for d in re.findall(r"Decision: (.{1,120}?) at T=", flat) if d not in headline]
    if others:
        bad.append(f"another configuration is called the decision: {others}")
    return bad


def vllm_gamma(text: str) -> int | None:
    """num_speculative_tokens of a vLLM export (None: speculation off, speculative_config null)."""
    config = json.loads(text).get("speculative_config")
    return None if config is None else int(config["num_speculative_tokens"])


def llamacpp_gamma(text: str) -> int | None:
    """The n-max of a llama.cpp export's flags (--spec-draft-n-max, or n-gram's --spec-ngram-simple-size-m); None
    when the flags turn speculation off (no --spec-type, no -md)."""
    flags = " ".join(line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")).split()
    if "--spec-type" not in flags and "-md" not in flags:
        return None
    for name in ("--spec-draft-n-max", "--spec-ngram-simple-size-m"):
        if name in flags:
            return int(flags[flags.index(name) + 1])
    raise AssertionError(f"a llama.cpp export speculates without an n-max: {flags}")


OFF_WHY = re.compile(r"Speculation off: .*(lost at every γ measured|predicts only|past the crossover)")


def page_gamma(snap: Snapshot) -> int | None:
    """The γ the Recommend page recommends: its γ metric and its banner must agree (None: off)."""
    metric = [m.value for g in snap.metrics for m in g if m.label == "γ"]
    assert len(metric) == 1, f"{snap.name}: expected one γ metric, found {metric}"
    if "off" in metric[0]:
        assert snap.off, f"{snap.name}: γ metric {metric[0]!r} but no 'Speculation OFF' banner"
        return None
    banner = re.search(r"with γ = (\d+): (?:predicted|measured)", snap.text)  # measured: it disagreed beyond noise
    assert banner, f"{snap.name}: no decision banner naming γ"
    assert int(banner.group(1)) == int(metric[0]), f"{snap.name}: banner γ {banner.group(1)} vs metric {metric[0]}"
    return int(metric[0])


# --- the parsers catch planted violations (they run without a browser) ----------------------------------------------


def test_text_check_catches_a_speedup_above_its_tokens_per_call() -> None:
    planted = "fixed:2 (γ=2): 1.35 tokens per target call, 3.07× predicted, +0.0% over the best fixed γ=2"
    assert text_violations([planted]) and "3.07×" in text_violations([planted])[0]
    assert text_violations(["ngram with γ = 2: predicted 3.58× faster · ops multiplier 1.07×"])  # above γ+1
    assert text_violations(["Mean acceptance length 1.20 and a speedup of 1.40×"])
    fine = [
        "fixed:2 (γ=2): 1.85 tokens per target call, 1.58× predicted, +0.0% over the best fixed γ=2",
        "ngram with γ = 2: predicted 1.58× faster · ops multiplier 1.07× · cost per token -37%",
        "γ=7 gives 5.70× faster at 8.10× more arithmetic",  # arithmetic is not a speedup
        "the measured 0.81× at γ=1 is impossible — that run delivered 0.60 tokens per target call",  # flagged
        "1.02× beside 1.00 tokens per call",  # within the 5% slack of a measurement
    ]
    assert text_violations(fine) == []
    assert text_speedups("ops multiplier 2.07× and 1.5× faster, cost ×1.2") == [1.5]


def test_grid_check_catches_a_row_over_its_bound_unless_flagged() -> None:
    runs = Grid(["draft", "γ", "mean acceptance length", "speedup measured"], [["ngram", "3", "1.35", "3.07"]])
    assert grid_violations(runs) == [
        "speedup measured 3.07× above mean acceptance length 1.35 in row ['ngram', '3', '1.35', '3.07']",
    ]
    head = ["γ", "tokens per call", "predicted speedup", "reference: Thm 3.8 (one α)", "measured speedup", "check"]
    curve = Grid(
        head,
        [
            ["1", "1.64", "1.45", "1.87", "1.23", ""],
            ["2", "1.85", "1.90", "2.6", "", ""],
            ["3", "1.89", "1.58", "4.2", "", ""],
            ["4", "1.5", "1.4", "", "2.9", "⚠ measurement error"],
        ],
    )
    found = grid_violations(curve)
    assert len(found) == 2 and "predicted speedup 1.90× above tokens per call 1.85" in found[0]
    assert "reference: Thm 3.8 (one α) 4.20× above γ+1 = 4" in found[1]  # the reference is held to γ+1 only
    live = Grid(["policy", "tokens/call replayed", "tokens/call live", "speedup predicted", "speedup live"],
                [["fixed:3", "1.89", "1.20", "1.58", "1.40"]])  # fmt: skip
    found = grid_violations(live)
    assert len(found) == 1 and "speedup live 1.40× above tokens/call live 1.20" in found[0]
    theory = Grid(["α", "γ", "Latency", "Arithmetic"], [["0.9", "3", "4.44× faster", "1.16× more"]])
    assert grid_violations(theory) and "above γ+1 = 4" in grid_violations(theory)[0]


def test_metric_check_and_off_check_catch_planted_violations() -> None:
    row = [Metric("Tokens/s", "652.2", "+77% vs baseline (2.77×)"), Metric("Mean acceptance length", "1.89")]
    assert metric_violations([row]) and "2.77×" in metric_violations([row])[0]
    assert metric_violations([[Metric("Tokens per call", "1.85"), Metric("Predicted speedup", "1.58×"),
                               Metric("Ops multiplier", "2.10×")]]) == []  # fmt: skip
    off = Snapshot("planted", "Speculation OFF — serve the target alone", lines=["crossover · recommended γ = 2"],
                   grids=[Grid(["γ", "mark"], [["2", "◀ best γ for this draft (speculation off)"]])],
                   metrics=[[Metric("Draft", "none"), Metric("γ", "2")]])  # fmt: skip
    found = off_violations(off)
    assert len(found) == 3 and any("◀ best" in f for f in found) and any("γ metric" in f for f in found)
    clean = Snapshot("clean", "Speculation OFF — serve the target alone", metrics=[[Metric("γ", "0 (off)")]])
    assert off_violations(clean) == []
    assert off_violations(Snapshot("on", "ngram with γ = 2: recommended γ = 2")) == []  # not off: nothing to say


def test_known_defects_match_only_what_they_name() -> None:
    """A defect list turns exactly the reported defects into an expected failure, nothing else."""
    engines = Grid(["engine", "session", "draft", "γ", "tokens per call", "speedup measured"],
                   [["llama.cpp", "2", "ngram", "4", "1.04", "2.76"],
                    ["llama.cpp", "2", "ngram", "1", "1", "2.63"]])  # fmt: skip
    runs = Grid(["draft", "γ", "tokens per call", "speedup measured"], [["ngram", "4", "1.04", "2.76"]])
    live = [[Metric("Tokens/s", "3.6", "+11% vs baseline (1.11×)"), Metric("Tokens per call", "1.00")]]
    off = Snapshot("rec_forced_off", "Speculation OFF", grids=[Grid(["γ", "mark"], [["1", "◀ best γ for this draft "
                   "(speculation off) · crossover"]])], metrics=[[Metric("γ", "0 (off)")]])  # fmt: skip
    known = [
        *(f"recommend_both: {p}" for p in grid_violations(engines)),
        *(f"run_llamacpp: {p}" for p in metric_violations(live)),
        *(f"rec_forced_off (off): {p}" for p in off_violations(off)),
    ]
    new = [
        *(f"sessions_tiny: {p}" for p in grid_violations(runs)),  # the Sessions page has no known defect
        *(f"recommend_both: {p}" for p in grid_violations(runs)),  # a Recommend table other than the engines'
        "rec_forced_off (off): 'recommended γ=1' in 'recommended γ=1'",
    ]
    assert len(known) == 5 and split_known([*known, *new], FIXED_DEFECTS) == (new, known)
    assert split_known([*known, *new]) == ([*known, *new], [])  # fixed: the walk fails on any of them again


def test_headline_check_catches_a_prediction_that_hides_its_measurement() -> None:
    run = MeasuredRun("ngram", 2, 0.80, 0.60, 0.95)
    hidden = "ngram with γ = 2: predicted 1.15× faster · ops multiplier 1.07×"
    assert headline_violations(hidden, [run]) and "measured 0.80×, not shown" in headline_violations(hidden, [run])[0]
    silent = hidden + "\nmeasured 0.80× on this very configuration over the whole run (prompts 0.60–0.95×)"
    assert headline_violations(silent, [run]) and "without saying so" in headline_violations(silent, [run])[0]
    said = ("ngram with γ = 2: measured 0.80× (predicted 1.15×: they disagree beyond the noise)\n"
            "measured 0.80× on this very configuration over the whole run")  # fmt: skip
    within = ("ngram with γ = 2: predicted 0.92× faster\nmeasured 0.80× on this very configuration over the whole "
              "run: the prediction 0.92× lies within its noise")  # fmt: skip
    assert headline_violations(said, [run]) == headline_violations(within, [run]) == []
    assert headline_violations(hidden, [MeasuredRun("ngram", 4, 0.8, 0.6, 0.95)]) == []  # another γ: nothing to say
    thrown = MeasuredRun("ngram", 1, 3.24, 1.64, 5.62)  # impossible at 1.00 tokens per call, under load
    flagged = "ngram with γ = 1: predicted 1.02× faster\nDecision: … measured 3.24×, impossible (a measurement error)"
    assert headline_violations(flagged, [thrown]) == []
    assert headline_violations(flagged.replace(", impossible", ""), [thrown])  # unflagged, it must say so


def test_page_gamma_reads_a_headline_that_shows_its_measurement() -> None:
    metric = [[Metric("Draft", "ngram"), Metric("γ", "2")]]
    measured = Snapshot("rec", "ngram with γ = 2: measured 0.15× (predicted 1.04×: they disagree beyond the noise)",
                        metrics=metric)  # fmt: skip
    assert page_gamma(measured) == 2
    with pytest.raises(AssertionError, match="banner γ 3"):
        page_gamma(Snapshot("rec", "ngram with γ = 3: predicted 1.04× faster", metrics=metric))


def test_out_of_view_catches_a_missing_or_cut_header() -> None:
    wanted = ["speedup measured", "verdict"]
    assert out_of_view(["draft", "speedup measured", "verdict", "c"], wanted, scrolls=True) == []
    assert out_of_view(["draft", "speedup measured"], wanted, scrolls=True) == ["speedup measured", "verdict"]
    assert out_of_view(["draft", "speedup measured", "verdict"], wanted, scrolls=True) == ["verdict"]  # cut
    assert out_of_view(["draft", "speedup measured", "verdict"], wanted, scrolls=False) == []  # all of it fits
    runs = Grid(["draft", "kind", "speedup measured", "verdict", "speedup predicted", "per-prompt spread"], [])
    history = Grid(["id", "name", "best speedup", "error"], [])
    snap = Snapshot("sessions_x", "", [], [history, runs], [], [])
    views = [(["id", "name", "best speedup", "error"], False), (["draft", "kind", "speedup measured", "verdict"], True)]
    assert sessions_out_of_view(snap, views) == [
        "'verdict' not in view at 1400 px (in view: ['draft', 'kind', 'speedup measured', 'verdict'])",
        "'speedup predicted' not in view at 1400 px (in view: ['draft', 'kind', 'speedup measured', 'verdict'])",
    ]


def test_decision_check_catches_a_second_answer_and_an_unsaid_measurement() -> None:
    said = "ngram γ=2 at T=0: predicted 1.33×, measured 1.21× over the whole run (faster)."
    assert decision_violations(f"Decision: {said}\nmore", said, True) == []
    assert decision_violations("Recommendation: ngram γ=2", said, True)[0].startswith("the stored decision is shown 0")
    twice = f"Decision: {said} Decision: qwen γ=3 at T=0: predicted 1.5×."
    assert any("another configuration" in p for p in decision_violations(twice, said, True))
    unmeasured = "ngram γ=2 at T=0: predicted 1.33×."
    assert any("does not say so" in p for p in decision_violations(f"Decision: {unmeasured}", unmeasured, False))


def test_export_gamma_readers() -> None:
    assert vllm_gamma('{"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}') == 3
    assert vllm_gamma('{"speculative_config": null, "reason": "Speculation off"}') is None
    assert llamacpp_gamma("# γ=9 in a comment\n-md d.gguf --spec-type draft-simple --spec-draft-n-max 4\n") == 4
    assert llamacpp_gamma("--spec-type ngram-simple --spec-ngram-simple-size-n 1 --spec-ngram-simple-size-m 2") == 2
    assert llamacpp_gamma("# Speculation off\n# launch llama-server without -md / --spec-type\n") is None


# ----------------------------------------------------------------------------------------------------------------------
# the browser side

SETTLED_JS = """
() => {
  const app = document.querySelector('[data-testid=stApp]');
  const state = app && app.getAttribute('data-test-script-state');
  if (state !== 'notRunning') return 'script ' + state;
  if (!document.querySelector('[data-testid=stMain] h1')) return 'no title yet';
  if (document.querySelector('[data-testid=stMain] [data-testid=stSkeleton]')) return 'skeleton';
  // drawn only where shown: not in a closed expander, not in another tab
  const shown = e => e.getBoundingClientRect().width > 0 && !e.closest('details:not([open])');
  for (const f of document.querySelectorAll('[data-testid=stMain] [data-testid=stDataFrame]'))
    if (shown(f) && !f.querySelector('table[role=grid] th')) return 'table not drawn';
  for (const c of document.querySelectorAll('[data-testid=stMain] [data-testid=stVegaLiteChart]'))
    if (shown(c) && !c.querySelector('canvas, svg')) return 'chart not drawn';
  return '';
}
"""
OPEN_EXPANDERS_JS = """
() => document.querySelectorAll('[data-testid=stExpander] details:not([open]):not([data-walk-opened])').forEach(d => {
  d.setAttribute('data-walk-opened', '1'); const s = d.querySelector('summary'); if (s) s.click(); })
"""
GRID_TREE_JS = """
(f) => {
  const t = f.querySelector('table[role=grid]');
  if (!t) return null;
  const head = [...t.querySelectorAll('thead th')].map(th => [+th.getAttribute('aria-colindex'), th.textContent]);
  const cells = [];
  for (const tr of t.querySelectorAll('tbody tr'))
    for (const td of tr.querySelectorAll('td'))
      cells.push([+tr.getAttribute('aria-rowindex'), +td.getAttribute('aria-colindex'), td.textContent]);
  return {head, cells, rows: +t.getAttribute('aria-rowcount'), cols: +t.getAttribute('aria-colcount')};
}
"""
SCROLL_JS = """
([f, top, left]) => {
  const s = f.querySelector('.dvn-scroller');
  if (!s) return null;
  s.scrollTop = top; s.scrollLeft = left;
  return [s.scrollHeight, s.clientHeight, s.scrollWidth, s.clientWidth];
}
"""
METRICS_JS = """
() => {
  const groups = new Map();
  for (const m of document.querySelectorAll('[data-testid=stMain] [data-testid=stMetric]')) {
    const block = m.closest('[data-testid=stHorizontalBlock]') || m;
    if (!groups.has(block)) groups.set(block, []);
    const get = id => (m.querySelector(`[data-testid=${id}]`) || {innerText: ''}).innerText.trim();
    groups.get(block).push([get('stMetricLabel'), get('stMetricValue'), get('stMetricDelta')]);
  }
  return [...groups.values()];
}
"""
LINES_JS = """
() => [...document.querySelectorAll('[data-testid=stMain] [data-testid=stMarkdownContainer], [data-testid=stMain] ' +
  '[data-testid=stCaptionContainer], [data-testid=stMain] svg text')].map(e => (e.innerText || e.textContent || ''))
"""


def settle(page: Any, timeout_s: float = 90.0, open_expanders: bool = True) -> float:
    """Wait until the script has finished, every visible table and chart has drawn and the text stopped changing
    for a second; returns the seconds waited. Expanders are opened on the way (unless told not to), so their
    tables draw too."""
    start = time.monotonic()
    deadline = start + timeout_s
    last, since, why = None, start, "not checked"
    while time.monotonic() < deadline:
        if open_expanders:
            page.evaluate(OPEN_EXPANDERS_JS)
        why = page.evaluate(SETTLED_JS)
        now = (why, page.locator("[data-testid=stMain]").inner_text()) if not why else None
        if now is not None and now == last and time.monotonic() - since >= 1.0:
            return time.monotonic() - start
        if now != last:
            last, since = now, time.monotonic()
        page.wait_for_timeout(150)
    raise AssertionError(f"{page.url}: the page never finished drawing ({why})")


def read_grid(page: Any, frame: Any) -> Grid | None:
    """Every cell of one data grid: the grid draws on a canvas and lists only the cells in view in its
    accessibility tree, so it is scrolled through, down and across."""
    handle = frame.element_handle()
    size = page.evaluate(SCROLL_JS, [handle, 0, 0])
    head: dict[int, str] = {}
    cells: dict[tuple[int, int], str] = {}
    rows = cols = 0
    if size is None:
        return None
    height, view_h, width, view_w = size
    tops = list(range(0, max(height - view_h, 0) + 1, max(int(view_h * 0.6), 1))) + [max(height - view_h, 0)]
    lefts = list(range(0, max(width - view_w, 0) + 1, max(int(view_w * 0.6), 1))) + [max(width - view_w, 0)]
    for left in dict.fromkeys(lefts):
        for top in dict.fromkeys(tops):
            if (top, left) != (0, 0):
                if rows and len({r for r, _ in cells}) >= rows - 1 and len(head) >= cols:
                    break  # every cell read already
                page.evaluate(SCROLL_JS, [handle, top, left])
                page.wait_for_timeout(350)  # the tree is rebuilt 200 ms after a scroll
            tree = page.evaluate(GRID_TREE_JS, handle)
            if tree is None:
                continue
            rows, cols = tree["rows"], tree["cols"]
            head.update({int(i): t for i, t in tree["head"]})
            cells.update({(int(r), int(c)): t for r, c, t in tree["cells"]})
    page.evaluate(SCROLL_JS, [handle, 0, 0])
    columns = sorted(head)
    row_ids = sorted({r for r, _ in cells})
    grid = Grid([head[c] for c in columns], [[cells.get((r, c), "") for c in columns] for r in row_ids], rows - 1)
    assert len(grid.rows) == grid.rowcount, f"{page.url}: read {len(grid.rows)} of {grid.rowcount} rows of {grid.head}"
    assert len(columns) == cols, f"{page.url}: read {len(columns)} of {cols} columns: {grid.head}"
    return grid


def heads_in_view(page: Any) -> list[tuple[list[str], bool]]:
    """Each data grid's column headers in view as the page opens (before any scroll): what a reader sees, and
    whether the grid scrolls sideways (then the last header in view may be cut at the grid's right edge)."""
    heads = []
    for frame in page.locator("[data-testid=stMain] [data-testid=stDataFrame]").all():
        if frame.bounding_box() and (tree := page.evaluate(GRID_TREE_JS, frame.element_handle())) is not None:
            size = page.evaluate(SCROLL_JS, [frame.element_handle(), 0, 0])
            heads.append(([text for _, text in sorted(tree["head"])], bool(size and size[2] > size[3])))
    return heads


def out_of_view(in_view: Sequence[str], wanted: Iterable[str], scrolls: bool) -> list[str]:
    """The `wanted` headers a reader cannot see whole without scrolling sideways: not in view (the grid lists
    only the columns it draws), or the last one in view of a grid that scrolls (cut at its right edge)."""
    cut = in_view[-1:] if scrolls else []
    return [h for h in wanted if h not in in_view or h in cut]


REPORT_JS = """
() => ({
  lines: document.body.innerText.split('\\n'),
  tables: [...document.querySelectorAll('table')].map(t => ({
    head: [...t.querySelectorAll('thead th')].map(th => th.innerText.trim()),
    rows: [...t.querySelectorAll('tbody tr')].map(tr => [...tr.querySelectorAll('th, td')]
      .map(c => c.innerText.trim())),
  })),
})
"""


def report_snapshot(page: Any, path: Path, name: str) -> Snapshot:
    """A session report (the HTML `python -m engine report` writes) as the browser shows it."""
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    read = page.evaluate(REPORT_JS)
    tables = [t for t in read["tables"] if t["head"]]
    grids = [Grid(t["head"], [r for r in t["rows"] if len(r) == len(t["head"])]) for t in tables]
    lines = [line for line in read["lines"] if line.strip()]
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    return Snapshot(name, "\n".join(lines), lines, grids, [], [])


def snapshot(page: Any, name: str) -> Snapshot:
    """What the page shows now (after settle)."""
    grids = []
    for frame in page.locator("[data-testid=stMain] [data-testid=stDataFrame]").all():
        if frame.bounding_box() and (grid := read_grid(page, frame)) is not None:
            grids.append(grid)
    metrics = [[Metric(*m) for m in group] for group in page.evaluate(METRICS_JS)]
    codes = [c.text_content() or "" for c in page.locator("[data-testid=stMain] [data-testid=stCode] code").all()]
    lines = [line for block in page.evaluate(LINES_JS) for line in block.splitlines() if line.strip()]
    lines += [line for code in codes for line in code.splitlines()]
    return Snapshot(name, page.locator("[data-testid=stMain]").inner_text(), lines, grids, metrics, codes)


def shot(page: Any, name: str, width: int | None = None) -> None:
    """The whole page (at `width`, else the walk's): Streamlit scrolls inside its main container, so grow the
    viewport to fit it first."""
    size = page.viewport_size
    if width is not None and width != size["width"]:
        page.set_viewport_size({"width": width, "height": size["height"]})
        settle(page, open_expanders=False)
    height = page.evaluate(
        "() => Math.max(...['[data-testid=stMain]', '[data-testid=stAppViewContainer]', 'section.main']"
        ".map(s => document.querySelector(s)).filter(Boolean).map(e => e.scrollHeight), 800)"
    )
    page.set_viewport_size({"width": width or size["width"], "height": min(int(height) + 40, 12000)})
    page.wait_for_timeout(300)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    page.set_viewport_size(size)
    if width is not None and width != size["width"]:
        settle(page, open_expanders=False)


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ, SPECTUNE_HOME=str(home), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop("SPECTUNE_DB_URL", None)
    return env


def _engine(home: Path, *args: str, timeout: float = 300) -> str:
    done = subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, env=_env(home), capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, f"python -m engine {' '.join(args)}: {done.stderr[-2000:]}"
    return done.stdout


def make_sessions(home: Path, prompts: Path) -> dict[str, int]:
    """The sessions a user would make from the CLI: the PyTorch loop with tiny models, llama.cpp with smollm2."""
    home.mkdir(parents=True, exist_ok=True)
    prompts.write_text(PROMPTS, encoding="utf-8")
    out = _engine(home, "submit", "--target", TARGET, "--draft", DRAFT, "--draft", "ngram", "--gamma", "1", "--gamma",
                  "3", "--prompts", str(prompts), "--max-new-tokens", "24", "--dtype", "float32", "--device", "cpu",
                  "--name", "walk: tiny loop")  # fmt: skip
    out += _engine(home, "submit", "--engine", "llamacpp", "--target", LLAMA_TARGET, "--draft", "ngram", "--gamma",
                   "2", "--gamma", "4", "--prompts", str(prompts), "--max-new-tokens", "24", "--no-regime",
                   "--name", "walk: llama.cpp")  # fmt: skip
    ids = [int(i) for i in re.findall(r"queued session (\d+)", out)]
    _engine(home, "worker", "--once", timeout=600)
    listed = json.loads(_engine(home, "sessions", "--json"))
    status = {int(s["id"]): s["status"] for s in listed}
    assert [status[i] for i in ids] == ["done", "done"], listed
    return {"tiny": ids[0], "llamacpp": ids[1]}


def _llama_missing() -> str | None:
    try:
        from engine.engines.llamacpp.binaries import find_llama

        find_llama()
    except Exception as exc:  # noqa: BLE001 - any reason it cannot run is a reason to skip
        return f"llama.cpp not installed (make setup): {exc}"
    return None


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
    """Two finished sessions, the dashboard on their data directory and one Chromium page."""
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium not installed (make browser)")
    if why := _llama_missing():
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT / "tests"))
    from test_browser_e2e import _free_port, _stop, _wait_healthy

    from foundation.processes import die_with_parent

    tmp = tmp_path_factory.mktemp("walk")
    home = tmp / "home"
    ids = make_sessions(home, tmp / "walk_prompts.txt")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    log = open(tmp / "streamlit.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.serve", "--server.port", str(port), "--server.headless",
         "true", "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
         "--server.fileWatcherType", "none"],
        cwd=ROOT, env=_env(home), stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport=VIEWPORT, accept_downloads=True)
            page.set_default_timeout(TIMEOUT_MS)
            try:
                yield {"url": url, "home": home, "ids": ids, "page": page}
            finally:
                browser.close()
    finally:
        _stop(proc.pid)
        log.close()
        shutil.copy(tmp / "streamlit.log", ARTIFACTS / "streamlit.log")


def keep(snap: Snapshot) -> None:
    """What the walk read, next to the screenshot (artifacts/walk/NAME.json)."""
    grids = [{"head": g.head, "rows": g.rows} for g in snap.grids]
    metrics = [[m.__dict__ for m in group] for group in snap.metrics]
    record = {"name": snap.name, "off": snap.off, "grids": grids, "metrics": metrics, "lines": snap.lines}
    (ARTIFACTS / f"{snap.name}.json").write_text(json.dumps(record, indent=1, ensure_ascii=False))


def split_known(
    problems: Sequence[str], defects: Sequence[re.Pattern[str]] | None = None
) -> tuple[list[str], list[str]]:
    """(new problems, known ones: `defects`, by default KNOWN_DEFECTS)."""
    patterns = KNOWN_DEFECTS if defects is None else defects
    known = [p for p in problems if any(rx.search(p) for rx in patterns)]
    return [p for p in problems if p not in known], known


def visit(walk: Mapping[str, Any], path: str, name: str) -> Snapshot:
    page = walk["page"]
    t0 = time.monotonic()
    page.goto(f"{walk['url']}/{path}")
    drawn = settle(page)
    t1 = time.monotonic()
    snap = snapshot(page, name)
    t2 = time.monotonic()
    shot(page, name)
    shot(page, f"{name}@{WIDE}", WIDE)
    keep(snap)
    print(
        f"walk {name}: drawn {t1 - t0:.1f} s (settled {drawn:.1f}), read {t2 - t1:.1f} s, "
        f"shot {time.monotonic() - t2:.1f} s"
    )
    errors = page.locator("[data-testid=stMain] [data-testid=stException]").all_inner_texts()
    assert not errors, f"{name}: the page raised: {errors}"
    return snap


KNOWN_DEFECTS: list[re.Pattern[str]] = []  # reported defects not fixed yet (none now)
FIXED_DEFECTS = [  # what the walk found and what was fixed since: the mechanism is tested on them
    # Run page, live view: "Tokens/s … +11% vs baseline (1.11×)" beside "Tokens per call 1.00" — the ratio of
    # end-to-end tokens/s is never checked against the run's own tokens per call
    # (engine.analysis.bounds.check_measured_speedup), so on a busy machine an impossible speedup is shown unflagged
    # (app/run_view.speed_delta and its caller in app/pages/2_Run.py).
    re.compile(r"^run_\w+: Tokens/s [\d.]+× above"),
    # Recommend page, "Engines side by side" (app/components.engine_picker
    # over
    # engine.service.decide.evidence.engine_comparison): a run's "speedup measured" is shown beside its "tokens per
    # call"
    # with no check, so an impossible one (2.76× at 1.04 tokens per call) carries no flag there, while the crossover
    # table flags the same run.
    re.compile(
        r"^rec\w*: speedup measured [\d.]+× above (tokens per call [\d.]+|γ\+1 = \d+) in row "
        r"\['(spectune|llama\.cpp|vllm)'"
    ),
    # Recommend page, speculation OFF: the crossover table still marks a row "◀ best γ for this draft (speculation
    # off)" and highlights it (app/recommend_view.curve_view), where off should name no γ.
    re.compile(r"\(off\): '◀ ?best' in '◀ best γ for this draft \(speculation off\)"),
]


def walk_paths(ids: Mapping[str, int]) -> list[tuple[str, str]]:
    tiny, llama = ids["tiny"], ids["llamacpp"]
    both = f"{tiny},{llama}"
    return [
        ("", "home"), ("Prompts", "prompts"),
        (f"Run?session={tiny}", "run_tiny"), (f"Run?session={llama}", "run_llamacpp"),
        (f"Sessions?session={tiny}", "sessions_tiny"), (f"Sessions?session={llama}", "sessions_llamacpp"),
        ("Theory", "theory"), (f"Recommend?session={tiny}", "recommend_tiny"),
        (f"Recommend?session={llama}", "recommend_llamacpp"), (f"Recommend?session={both}", "recommend_both"),
        ("Endpoints", "endpoints"), (f"Policies?session={tiny}", "policies_tiny"),
        (f"Policies?session={llama}", "policies_llamacpp"),
    ]  # fmt: skip


RUNS_IN_VIEW = ("speedup measured", "bound", "verdict", "speedup predicted")  # where the runs table has them
HISTORY_IN_VIEW = ("best speedup",)


def sessions_out_of_view(snap: Snapshot, views: Sequence[tuple[list[str], bool]]) -> list[str]:
    """The Sessions page's runs and History tables: the speedup columns and their judgements a 1400 px screen
    must show without scrolling, where the table has them (`views`: heads_in_view, one per grid of `snap`)."""
    assert len(views) == len(snap.grids), f"{snap.name}: {len(views)} grids in view, {len(snap.grids)} read"
    runs = [(g, v) for g, v in zip(snap.grids, views, strict=True) if "kind" in g.head]
    history = [(g, v) for g, v in zip(snap.grids, views, strict=True) if "best speedup" in g.head]
    assert runs and history, f"{snap.name}: no runs or History table among {[g.head for g in snap.grids]}"
    bad = []
    for tables, wanted in ((runs, RUNS_IN_VIEW), (history, HISTORY_IN_VIEW)):
        for grid, (in_view, scrolls) in tables:
            hidden = out_of_view(in_view, [h for h in wanted if h in grid.head], scrolls)
            bad += [f"{h!r} not in view at 1400 px (in view: {in_view})" for h in hidden]
    return bad


def measured_runs(home: Path, ids: Iterable[int]) -> list[MeasuredRun]:
    """The sessions' stored speculative runs, greedy and one request at a time, as the headline check reads them."""
    from store import open_store

    store = open_store(f"sqlite:///{home / 'spectune.db'}")
    try:
        found = []
        for sid in ids:
            for run in store.list_runs(sid):
                summary = run.get("summary") or {}
                whole, band = summary.get("speedup_whole_run"), summary.get("speedup_spread") or {}
                policy = run.get("policy") or summary.get("policy")
                if run["kind"] != "speculative" or policy or whole is None or run["temperature"] != 0.0:
                    continue
                if summary.get("concurrency", 1) != 1:
                    continue
                # the band as MeasuredCheck takes it: the prompts' ratios and the whole-run figure they surround
                low, high = min(band.get("min", whole), whole), max(band.get("max", whole), whole)
                found.append(MeasuredRun(run["draft"], int(run["gamma"]), float(whole), float(low), float(high)))
        return found
    finally:
        store.close()


def stored_decision(home: Path, sid: int) -> Any:
    """The session's stored decision at its serving batch, greedy, the default objective (as the worker stored it)."""
    from engine.service.decide.decisions import DecisionQuery, decision_for
    from store import open_store

    store = open_store(f"sqlite:///{home / 'spectune.db'}")
    try:
        return decision_for(store, [sid], DecisionQuery(temperature=0.0))
    finally:
        store.close()


@pytest.mark.browser
def test_every_page_shows_speedups_within_their_bounds_and_off_names_no_gamma(walk) -> None:
    problems: list[str] = []
    seen: dict[str, Snapshot] = {}
    ids = walk["ids"]
    measured = measured_runs(walk["home"], ids.values())
    for path, name in walk_paths(ids):
        snap = seen[name] = visit(walk, path, name)
        problems += [f"{name}: {p}" for p in bound_violations(snap)]
        problems += [f"{name} (off): {p}" for p in off_violations(snap)]
        problems += [f"{name} (headline): {p}" for p in headline_violations(snap.text, measured)]
        if name.startswith("sessions_"):  # on a 1400 px screen, unscrolled: each speedup and what judges it
            problems += [f"{name}: {p}" for p in sessions_out_of_view(snap, heads_in_view(walk["page"]))]
    # the walk read real content: the figures the checks are about are on the pages it checked
    runs = next(g for g in seen["sessions_tiny"].grids if "speedup measured" in g.head)
    tpc = next(h for h in runs.head if TPC_HEADER.search(h))
    assert len(runs.rows) >= 3 and all(_float(runs.column(r, tpc)) for r in runs.rows), runs
    assert any("tokens per call" in g.head for g in seen["recommend_tiny"].grids)
    assert any(TPC_HEADER.search(m.label) for g in seen["run_tiny"].metrics for m in g)
    assert "llama.cpp" in seen["sessions_llamacpp"].text
    # one question, one answer: each session's stored decision, word for word, on every page that answers it
    for kind, sid in ids.items():
        decision = stored_decision(walk["home"], sid)
        pages = [f"run_{kind}", f"sessions_{kind}", f"recommend_{kind}"] + (["policies_tiny"] if kind == "tiny" else [])
        for name in pages:
            problems += [f"{name} (decision): {p}" for p in decision_violations(
                seen[name].text, decision.headline(), decision.off or decision.measured is not None)]  # fmt: skip
        floor = decision.floor or {}
        said = "it does not hold" in seen[f"sessions_{kind}"].text
        if floor and said == bool(floor["holds"]):
            problems.append(f"sessions_{kind} (floor): the page and the floor rule disagree: {floor['sentence']}")
    # n-gram lookup in llama.cpp has no policy to replay: the page says that, not "sessions from before policies"
    assert "No draft of these sessions has a policy to replay" in seen["policies_llamacpp"].text
    assert "from before policies" not in seen["policies_llamacpp"].text
    new, known = split_known(problems)
    assert not new, "\n".join(new)
    if known:  # reported, not yet fixed: the walk keeps checking everything else
        pytest.xfail("known defects (see KNOWN_DEFECTS):\n" + "\n".join(known))


@pytest.mark.browser
def test_the_report_shows_speedups_within_their_bounds_and_its_headline_beside_its_measurement(walk) -> None:
    """The HTML report of each session, and of both, opened in the browser: the same checks as the pages."""
    ids = walk["ids"]
    measured = measured_runs(walk["home"], ids.values())
    problems: list[str] = []
    for chosen, name in (([ids["tiny"]], "report_tiny"), ([ids["llamacpp"]], "report_llamacpp"),
                         ([ids["tiny"], ids["llamacpp"]], "report_both")):  # fmt: skip
        path = walk["home"] / f"{name}.html"
        sessions = [arg for sid in chosen for arg in ("--session", str(sid))]
        _engine(walk["home"], "report", *sessions, "--html", str(path))
        snap = report_snapshot(walk["page"], path, name)
        keep(snap)
        heads = [g.head for g in snap.grids]
        assert any(TPC_HEADER.search(h) for head in heads for h in head), f"{name}: no runs table read: {heads}"
        problems += [f"{name}: {p}" for p in bound_violations(snap)]
        problems += [f"{name} (off): {p}" for p in off_violations(snap)]
        problems += [f"{name} (headline): {p}" for p in headline_violations(snap.text, measured)]
    assert not problems, "\n".join(problems)


def _recommend_files(home: Path, ids: Sequence[int], **kwargs: Any) -> dict[str, str]:
    """The exports the service call the Recommend page makes returns for the same inputs."""
    from engine.service.decide.recommendations import recommend_and_export
    from store import open_store

    store = open_store(f"sqlite:///{home / 'spectune.db'}")
    try:
        result = recommend_and_export(store, list(ids), **kwargs)
        return {fmt: text for fmt, (_, text) in result.files.items()}
    finally:
        store.close()


def _shown_export(snap: Snapshot, key: str) -> str:
    found = [c for c in snap.codes if (key in c)]
    assert len(found) == 1, f"{snap.name}: {len(found)} export blocks contain {key!r}"
    return found[0]


def _download(page: Any, fmt: str) -> str:
    """Press the export section's download button, as a user does, and read the file the browser saved."""
    with page.expect_download() as info:
        page.locator(f".st-key-rec_dl_{fmt}").get_by_role("button").first.click()
    path = info.value.path()
    settle(page)  # the press also saved the recommendation to the history (a rerun)
    return Path(path).read_text(encoding="utf-8")


def _check_gammas(
    walk: Mapping[str, Any], snap: Snapshot, ids: Sequence[int], download: bool, **kwargs: Any
) -> int | None:
    """The page's γ (None: off) after checking that both exports the page shows (and, with `download`, hands
    out) carry it and equal what the service returns for the same inputs."""
    gamma = page_gamma(snap)
    shown = {"vllm": _shown_export(snap, '"engine": "vllm"'), "llamacpp": _shown_export(snap, "# llama-server flags")}
    service = _recommend_files(walk["home"], ids, **kwargs)
    for fmt, text in shown.items():
        assert text.strip() == service[fmt].strip(), f"{snap.name}: the page's {fmt} export is not the service's"
    if download:
        shown = {fmt: _download(walk["page"], fmt) for fmt in ("vllm", "llamacpp")}
        for fmt, text in shown.items():
            assert text == service[fmt], f"{snap.name}: the downloaded {fmt} file is not the service's export"
    assert vllm_gamma(shown["vllm"]) == gamma, f"{snap.name}: page γ {gamma}, vLLM {vllm_gamma(shown['vllm'])}"
    assert llamacpp_gamma(shown["llamacpp"]) == gamma, (
        f"{snap.name}: page γ {gamma}, llama.cpp {llamacpp_gamma(shown['llamacpp'])}"
    )
    return gamma


@pytest.mark.browser
def test_recommend_gamma_equals_the_exported_gamma_and_a_forced_off_names_none(walk) -> None:
    ids = walk["ids"]
    cases = [([ids["tiny"]], "rec_gamma_tiny"), ([ids["llamacpp"]], "rec_gamma_llamacpp"),
             ([ids["tiny"], ids["llamacpp"]], "rec_gamma_both")]  # fmt: skip
    gammas: dict[str, int | None] = {}
    problems: list[str] = []
    for chosen, name in cases:
        snap = visit(walk, f"Recommend?session={','.join(map(str, chosen))}", name)
        gammas[name] = _check_gammas(walk, snap, chosen, download=name.endswith("both"))
        problems += [f"{name}: {p}" for p in bound_violations(snap)]
        if gammas[name] is None:  # a machine may measure a loss: then off, said why, and no γ left on the page
            assert OFF_WHY.search(snap.text), f"{name}: off without the measured reason: {snap.text[:2000]}"
            problems += [f"{name} (off): {p}" for p in off_violations(snap)]
    # the tiny loop is overhead-bound (a forward costs far less than Python's step), so a call that delivers
    # several tokens pays on every CPU: the γ comparison above always has a speculating case
    assert gammas["rec_gamma_tiny"] is not None and gammas["rec_gamma_tiny"] >= 1, gammas

    # OFF, forced through the page's own inputs: cost per token on a compute-bound server
    page = walk["page"]
    chosen = [ids["tiny"], ids["llamacpp"]]
    page.goto(f"{walk['url']}/Recommend?session={','.join(map(str, chosen))}")
    settle(page)
    page.get_by_text("Cost per token", exact=True).first.click()
    settle(page)
    page.locator("[data-testid=stSelectbox]").filter(has_text="Regime").first.click()
    page.get_by_role("option", name="compute-bound").click()
    settle(page)
    snap = snapshot(page, "rec_forced_off")
    shot(page, "rec_forced_off")
    keep(snap)
    assert snap.off, f"forcing cost + compute-bound did not turn speculation off: {snap.text[:2000]}"
    assert _check_gammas(walk, snap, chosen, download=True, objective="cost", regime_override="compute-bound") is None
    problems += [f"rec_forced_off: {p}" for p in bound_violations(snap)]
    problems += [f"rec_forced_off (off): {p}" for p in off_violations(snap)]
    new, known = split_known(problems)
    assert not new, "\n".join(new)
    if known:  # reported, not yet fixed: everything else was checked above
        pytest.xfail("known defects (see KNOWN_DEFECTS):\n" + "\n".join(known))
