"""The Watch page's words and frames from stored window rows (app.watch_view): pure, no Streamlit."""

from __future__ import annotations

from datetime import UTC, datetime

from app import watch_view as wv


def row(second: int, verdict: str, **figures) -> dict:
    return {"ended_at": datetime(2026, 12, 6, 1, 0, second, tzinfo=UTC), "seconds": 4.0, "verdict": verdict,
            "figures": figures}  # fmt: skip


ROWS = [row(0, "paying", predicted_speedup=1.85, mean_acceptance_length=4.6, batch=1, why="predicted 1.85× at batch 1"),
        row(4, "costing you", predicted_speedup=0.8, batch=8, action="turn speculation off at batch 8", why="below"),
        row(8, "source down", message="connection refused")]  # fmt: skip


def test_a_state_after_a_verdict_leaves_the_last_judged_window_to_show() -> None:
    assert wv.last_judged(ROWS) is ROWS[1] and wv.last_judged(ROWS[:1]) is ROWS[0]
    assert wv.last_judged([ROWS[2]]) is None
    assert [wv.tone(r["verdict"]) for r in ROWS] == ["success", "error", "warning"]
    assert wv.tone("idle") == "info"


def test_the_headline_says_why_and_what_to_do_escaped() -> None:
    assert wv.headline(ROWS[1]) == "**costing you**: below. What to do: turn speculation off at batch 8."
    assert wv.headline(ROWS[2]) == "**source down**: connection refused."
    assert "\\*" in wv.headline(row(1, "paying", why="*bold*"))


def test_the_timeline_and_the_table_keep_every_window() -> None:
    frame = wv.timeline(ROWS)
    assert list(frame["verdict"]) == ["paying", "costing you", "source down"]
    assert frame["predicted_speedup"].isna().tolist() == [False, False, True]
    table = wv.windows_table(ROWS)
    assert list(table["verdict"]) == ["source down", "costing you", "paying"]  # newest first
    assert list(table["predicted"]) == ["", "0.80×", "1.85×"] and list(table["batch"]) == ["", "8", "1"]
    assert wv.verdict_counts(ROWS) == {"paying": 1, "costing you": 1, "source down": 1}
