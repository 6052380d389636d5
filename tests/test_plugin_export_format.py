"""An export format is one record, registered once: a toy format written in this file alone is offered by the
CLI's recommend, made by the service call every caller uses, shown with its label on the Recommend page and in
the report, and nothing outside the format's own module asks which format it is."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.analysis.export import ExportFormat, register, unregister
from engine.analysis.export.deployment import Deployment
from engine.analysis.export.files import Fit, JsonFile
from tests.t5_sessions import T5, store_session
from tests.test_app_pages import assert_clean, env, page  # noqa: F401 - env: fixture

ROOT = Path(__file__).resolve().parents[1]


def toy_config(dep: Deployment) -> JsonFile:
    """A toy engine's file: the draft and γ it would serve with."""
    return JsonFile({"draft": dep.rec.draft_name, "gamma": dep.gamma}, Fit(True, f"γ={dep.gamma}"))


TOY = ExportFormat(name="toy", label="Toy engine", filename="toy-engine.json", language="json",
                   mime="application/json", policy_support="fixed γ", config=toy_config)  # fmt: skip


@pytest.fixture
def toy() -> Iterator[ExportFormat]:
    register(TOY)
    yield TOY
    unregister(TOY.name)


def test_a_toy_format_is_offered_everywhere_formats_are(env, toy, capsys) -> None:  # noqa: F811
    from engine.service.cli.main import main
    from engine.service.decide.recommendations import recommend_and_export
    from engine.service.report.document import session_report_html

    sid = store_session(env.store, T5)
    result = recommend_and_export(env.store, [sid])
    assert not result.failed, result.failed
    filename, text = result.files["toy"]
    made = json.loads(text)
    assert filename == "toy-engine.json" and made == {"draft": "t5-small", "gamma": result.recommendation.gamma}
    assert main(["recommend", "--session", str(sid), "--export", "toy"]) == 0
    assert text.strip() in capsys.readouterr().out  # the CLI prints the toy engine's file
    at = page("pages/5_Recommend.py", {"session": str(sid)})
    assert_clean(at)
    assert "⬇ Toy engine" in [b.proto.label for b in at.get("download_button")]
    assert "Toy engine — toy-engine.json" in session_report_html(env.store, sid)


def test_a_format_unregistered_is_refused_with_the_others_named(env) -> None:  # noqa: F811
    from engine.analysis.export import export_format

    with pytest.raises(ValueError, match=re.escape("format must be one of ('vllm', 'sglang'")):
        export_format("toy")
