"""The shareable session report (engine.service.report.document) on a session really decoded with tiny models.

One session is decoded once for the module (a tiny target, a noisy copy of it and n-gram lookup as drafts, the
batch sweep on), in its own SQLite store; the report must be one self-contained HTML document whose figures are
the ones the recommendation service and the Sessions page compute: the recommended γ (or speculation OFF and no
γ), the exported vLLM file byte for byte, each run's measured speedup, spread and flags.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

from engine.errors import SettingsError
from engine.service.decide.recommendations import recommend_and_export
from engine.service.jobs import submit_session
from engine.service.report.document import report_filename, report_or_error, session_report_html
from engine.service.report.runs import run_figures
from engine.session.spec import SessionSpec
from store import open_store

ROOT = Path(__file__).resolve().parents[1]
HOME_PAGE = ROOT / "app" / "Home.py"
TARGET = "tiny:1:48:2:64"
DRAFT = "tiny:1:48:2:64~0.15"
NAME = "shared <script>alert(1)</script> & co"
REPORT_BUTTON = "⬇ Report (one HTML file)"


@pytest.fixture(scope="module")
def decoded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """A finished session, decoded for real: baseline, the tiny draft and n-gram lookup at γ = 1, 2, 3."""
    import torch

    from engine.service.worker.loop import serve

    home = tmp_path_factory.mktemp("report-home")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    store = open_store(f"sqlite:///{home / 'spectune.db'}")
    prompts = [{"text": f"prompt {i}: count from {i} to {i + 9}, then back.", "category": "counting"} for i in range(3)]
    set_id, _, _ = store.add_prompt_set("report prompts", None, prompts)
    spec = SessionSpec(target=TARGET, drafts=[DRAFT, "ngram"], gammas=[1, 2, 3], max_new_tokens=24, dtype="float32",
                       detect_regime=True)  # fmt: skip
    sid = submit_session(store, spec, set_id, len(prompts), NAME)
    try:
        assert serve(store, once=True) == 1
        assert store.get_session(sid)["status"] == "done", store.get_session(sid)["error"]
        yield SimpleNamespace(store=store, sid=sid, home=home)
    finally:
        store.close()
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def report(decoded: SimpleNamespace) -> str:
    return session_report_html(decoded.store, decoded.sid)


class Collect(HTMLParser):
    """Every start tag with its attributes, and the text of each <pre data-format=…> block."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.pre: dict[str, str] = {}
        self._format: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "pre":
            self._format = dict(attrs).get("data-format")
            self.pre[self._format or ""] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "pre":
            self._format = None

    def handle_data(self, data: str) -> None:
        if self._format is not None:
            self.pre[self._format] += data


def parsed(document: str) -> Collect:
    collect = Collect()
    collect.feed(document)
    collect.close()
    return collect


def row_of(document: str, label: str) -> str:
    """The runs table's row whose first cell is `label`."""
    match = re.search(r"<tr><td>" + re.escape(html.escape(label)) + r"</td>(.*?)</tr>", document)
    assert match, f"no row for {label!r}"
    return match.group(1)


def missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def fact(document: str, label: str) -> str | None:
    match = re.search(r"<tr><th>" + re.escape(html.escape(label)) + r"</th><td>(.*?)</td></tr>", document)
    return None if match is None else html.unescape(match.group(1))


# ---------------------------------------------------------------------------------------------------------------------


def test_the_report_is_one_self_contained_html_document(report: str) -> None:
    assert report.startswith("<!DOCTYPE html>")
    doc = parsed(report)
    names = [name for name, _ in doc.tags]
    for needed in ("html", "head", "style", "body", "main", "table", "svg", "pre"):
        assert needed in names, needed
    assert names.count("svg") >= 3  # speedup per configuration, acceptance per position, speedup against γ
    assert "script" not in names and "link" not in names and "img" not in names and "iframe" not in names
    for name, attrs in doc.tags:
        for key in ("src", "href", "xlink:href", "action", "data"):
            value = (attrs.get(key) or "").strip().lower()
            assert not value.startswith(("http:", "https:", "//")), f"<{name} {key}={value}> reaches a network"
    assert "@import" not in report and "url(" not in report.split("</style>")[0]


def test_text_is_escaped_everywhere(report: str) -> None:
    assert "<script" not in report
    assert html.escape(NAME) in report  # the title and the header show the name as text


def test_the_settings_hardware_and_prompts_are_in_it(decoded: SimpleNamespace, report: str) -> None:
    session = decoded.store.get_session(decoded.sid)
    assert fact(report, "target") == TARGET
    assert fact(report, "drafts") == f"{DRAFT}, ngram"
    assert fact(report, "γ") == "1, 2, 3" and fact(report, "temperatures") == "0" and fact(report, "dtype") == "float32"
    assert fact(report, "machine") == session["summary"]["hardware"]["label"]
    for prompt in decoded.store.get_prompts(session["prompt_set_id"]):
        assert html.escape(prompt["text"]) in report


def test_each_run_shows_the_figures_the_sessions_page_shows(decoded: SimpleNamespace, report: str) -> None:
    from app import data
    from app import sessions_view as sv
    from engine.session.summarise import run_speedup

    runs = decoded.store.list_runs(decoded.sid)
    page = sv.runs_table(runs)  # the Sessions page's table
    figures = run_figures(runs, {}, {})
    assert [f.label for f in figures] == [data.run_label(r) for r in runs]
    for f, (_, row) in zip(figures, page.iterrows(), strict=True):
        for ours, theirs in (
            (f.alpha, "α"),
            (f.tokens_per_call, "tokens per call"),
            (f.c, "c"),
            (f.tokens_per_s, "tokens/s"),
            (f.baseline_tokens_per_s, "baseline tokens/s"),
            (f.speedup_measured, "speedup measured"),
            (f.speedup_predicted, "speedup predicted"),
        ):
            assert (missing(ours) and missing(row[theirs])) or ours == row[theirs], theirs
        if "verdict" in page.columns and f.verdict is not None:
            assert f.verdict == row["verdict"]
    for run in runs:
        cells = row_of(report, data.run_label(run))
        assert f'<td class="num">{run_speedup(run):.2f}×</td>' in cells  # the whole run's, as the page shows
        spread = (run.get("summary") or {}).get("speedup_spread")
        if run["kind"] == "speculative":
            assert f"{spread['min']:.2f}–{spread['max']:.2f}×" in cells
            assert f'<td class="num">{run["alpha"]:.3f}</td>' in cells
            assert f'<td class="num">{run["tokens_per_call"]:.2f}</td>' in cells
            assert f'<td class="num">{run["summary"]["draft_acceptance_rate"]:.3f}</td>' in cells
            assert "identical" in cells  # greedy speculative outputs are the target's own


def test_the_recommendation_is_the_services(decoded: SimpleNamespace, report: str) -> None:
    result = recommend_and_export(decoded.store, [decoded.sid])
    rec = result.recommendation
    if rec.off:
        assert "Speculation OFF" in report and fact(report, "Recommended γ") is None
    else:
        assert fact(report, "Recommended γ") == str(rec.gamma)
        assert fact(report, "Predicted speedup") == f"{rec.predicted_speedup:.2f}×"
        assert f"γ = {rec.gamma}</strong>" in report and f"recommended γ = {rec.gamma}" in report  # banner, chart
        assert html.escape(str(rec.draft_name)) in report
    assert html.escape(rec.explanation) in report
    doc = parsed(report)
    assert set(doc.pre) == set(result.files)
    for fmt, (filename, text) in result.files.items():
        assert doc.pre[fmt] == text, fmt  # byte for byte the export API's file
        assert html.escape(filename) in report
    for summary in rec.comparison:  # a measured speedup that breaks its bound is flagged where the run is shown
        for message in summary.measured_flags.values():
            assert html.escape(message) in report


def test_speculation_off_shows_no_gamma_as_the_recommendation(decoded: SimpleNamespace) -> None:
    options = {"objective": "cost", "regime_override": "compute-bound"}  # extra arithmetic is billed: never cheaper
    result = recommend_and_export(decoded.store, [decoded.sid], **options)
    assert result.recommendation.off
    report = session_report_html(decoded.store, decoded.sid, **options)
    assert "<strong>Speculation OFF</strong> — serve the target alone" in report
    assert fact(report, "Recommended γ") is None and fact(report, "Speculation") == "off"
    assert "recommended γ" not in report.lower() and ">recommended<" not in report
    section = report.split('<section id="recommendation">')[1]
    banner = section.split('<div class="banner off">')[1].split("</div>")[0]
    figures = section.split('<table class="facts">')[1].split("</table>")[0]
    assert "γ" not in banner and "γ" not in figures  # the decision names no γ (the notes may explain one)
    assert parsed(report).pre["vllm"] == result.files["vllm"][1]
    assert '"speculative_config": null' in result.files["vllm"][1]


def test_a_missing_session_is_a_clear_settings_error(decoded: SimpleNamespace) -> None:
    with pytest.raises(SettingsError, match="session #999 does not exist"):
        session_report_html(decoded.store, 999)
    with pytest.raises(SettingsError, match="session #999 does not exist"):
        session_report_html(decoded.store, [decoded.sid, 999])
    with pytest.raises(SettingsError, match="at least one session"):
        session_report_html(decoded.store, [])
    page = report_or_error(decoded.store, 999)  # what a download made on click gets instead of a traceback
    assert "The report could not be made" in page and "session #999 does not exist" in page
    assert report_filename(3) == "spectune-session-3.html" and report_filename([3, 5]) == "spectune-sessions-3-5.html"


def test_a_session_that_is_not_done_still_gets_a_report_saying_why(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'queued.db'}")
    try:
        set_id, _, _ = store.add_prompt_set("one", None, [{"text": "hello"}])
        sid = submit_session(store, SessionSpec(target=TARGET, drafts=["ngram"], gammas=[2]), set_id, 1, "waiting")
        report = session_report_html(store, sid)
    finally:
        store.close()
    assert "No recommendation:" in report and "queued" in report and "No runs yet." in report


def test_the_cli_writes_the_report_and_refuses_a_missing_session(
    decoded: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.service.cli.main import main

    monkeypatch.setenv("SPECTUNE_HOME", str(decoded.home))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    out = tmp_path / "report.html"
    assert main(["report", "--session", str(decoded.sid), "--html", str(out)]) == 0
    written = out.read_text(encoding="utf-8")
    assert written.startswith("<!DOCTYPE html>") and "<svg" in written and html.escape(NAME) in written
    assert main(["report", "--session", "999", "--html", str(out)]) == 2
    assert "error: session #999 does not exist" in capsys.readouterr().err


def _page(decoded: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, path: str) -> Any:
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    import engine.service.api

    monkeypatch.setenv("SPECTUNE_HOME", str(decoded.home))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    monkeypatch.setattr(engine.service.api, "worker_alive", lambda: None)
    st.cache_data.clear()
    at = AppTest.from_file(str(HOME_PAGE), default_timeout=120)
    at.query_params.update({"session": str(decoded.sid)})
    at.switch_page(path)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_sessions_page_offers_the_report(decoded: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _page(decoded, monkeypatch, "pages/3_Sessions.py")
    buttons = [b for b in at.get("download_button") if b.proto.label == REPORT_BUTTON]
    assert len(buttons) == 1 and "to share" in buttons[0].proto.help


def test_the_recommend_page_offers_the_report(decoded: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _page(decoded, monkeypatch, "pages/5_Recommend.py")
    buttons = [b for b in at.get("download_button") if b.proto.label == REPORT_BUTTON]
    assert len(buttons) == 1 and "to share" in buttons[0].proto.help
