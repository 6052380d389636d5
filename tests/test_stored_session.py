"""StoredSession: a stored session's options and summary read once, with one default for each key."""

from __future__ import annotations

import ast
from pathlib import Path

from engine.service.api import StoredSession

ROOT = Path(__file__).resolve().parents[1]


def test_a_queued_row_reads_as_empty_figures_not_errors() -> None:
    row = {"id": 7, "status": "queued", "summary": None, "options": None}
    stored = StoredSession.of(row)
    assert (stored.row["id"], stored.engine, stored.serving_batch, stored.policies) == (7, "spectune", 1, [])
    assert stored.summary == {} and stored.options == {} and stored.runs == [] and stored.hardware == {}
    assert stored.machine_note is None and stored.baseline_tokens_per_s is None and stored.engine_options == {}
    assert StoredSession.of(stored) is stored


def test_a_finished_row_reads_its_options_and_summary() -> None:
    row = {
        "id": 3,
        "options": {"engine": "llamacpp", "serving_batch": 8, "policies": ["confidence:0.6:8:0"],
                    "engine_options": {"ttft_slo_s": 0.5}},
        "summary": {"machine_note": "busy", "noisy_runs": ["ngram γ=2"], "baseline_tokens_per_s": 12.5,
                    "runs": [{"draft": "ngram"}, "not a run"], "phase_times_s": {"batch sweep": 4.0},
                    "hardware": {"label": "2 cores"}, "quick": {"probe_s": 30.0}, "endpoint": {"endpoints": []}},
    }  # fmt: skip
    stored = StoredSession.of(row)
    assert (stored.engine, stored.serving_batch, stored.policies) == ("llamacpp", 8, ["confidence:0.6:8:0"])
    assert stored.engine_options == {"ttft_slo_s": 0.5} and stored.endpoint_report == {"endpoints": []}
    assert (stored.machine_note, stored.noisy_runs, stored.baseline_tokens_per_s) == ("busy", ["ngram γ=2"], 12.5)
    assert stored.runs == [{"draft": "ngram"}] and stored.phase_times_s == {"batch sweep": 4.0}
    assert stored.hardware == {"label": "2 cores"} and stored.quick == {"probe_s": 30.0}
    assert stored.confirmation == {} and stored.suffix_cache == {}


def test_an_older_row_reads_its_engine_options_from_the_key_its_engine_kept_them_under() -> None:
    endpoint = {"url": "http://127.0.0.1:9", "concurrency": [1, 2]}
    older = StoredSession.of({"id": 4, "options": {"engine": "endpoint", "endpoint": endpoint}})
    assert older.engine_options == endpoint
    newer = StoredSession.of({"id": 5, "options": {"engine": "endpoint", "engine_options": endpoint, "loop": {}}})
    assert newer.engine_options == endpoint
    spectune = StoredSession.of({"id": 6, "options": {"engine": "spectune", "loop": {"kind": "eager"},
                                                      "endpoint": endpoint}})  # fmt: skip
    assert spectune.engine_options == {"kind": "eager"}


def stored_column_reads(source: str, name: str) -> list[str]:
    """`.get("options")` anywhere, `.get("summary")` on anything but a run: a stored session read around
    StoredSession."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"):
            continue
        key = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
        if key == "options" or (key == "summary" and owner != "run"):
            found.append(f"{name}:{node.lineno}: {owner}.get({key!r})")
    return found


def test_the_app_reads_stored_sessions_through_the_record() -> None:
    probe = 'def f(session, run):\n    return session.get("summary"), run.get("summary"), run.get("options")\n'
    assert stored_column_reads(probe, "probe.py") == [
        "probe.py:2: session.get('summary')",
        "probe.py:2: run.get('options')",
    ]
    found = [hit for path in sorted((ROOT / "app").rglob("*.py"))
             for hit in stored_column_reads(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]  # fmt: skip
    assert found == [], "\n".join(found)
