"""A kind of draft source added in this one file, and found everywhere a draft is offered.

`repeat` proposes the context's last token again, γ times: no model, no cost, and right wherever the target
repeats itself. Registered once through `register_draft_kind`, with nothing changed anywhere else, it is: decoded
by the CLI's `run` in spectune's loop, to exactly the target's output, and replayed to the figures it measured;
traced and ranked by the policy replay; offered by the Run page in spectune's engine and queued from it, and
refused in one line by llama.cpp's, whose form does not offer it; and exported to spectune's record as itself,
while each engine's file without it turns speculation off and says why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from test_app_pages import env, page, queue_drafts  # noqa: F401  (env is a fixture)

import engine.drafts.kinds as kinds
from engine.analysis.export import export, format_names
from engine.analysis.policy_replay import compare_policies
from engine.analysis.recommend import DraftMeasurement, recommend
from engine.core.decoder import DecodeConfig, decode_prompt
from engine.core.proposal import Proposal
from engine.core.sampling import SamplingConfig
from engine.drafts.factory import make_draft
from engine.drafts.kinds import DraftKind, check_by_parsing, draft_kind, register_draft_kind
from engine.engines import registry
from engine.errors import SettingsError
from engine.measure.agreement import draft_trace
from engine.service.cli.main import main as cli
from engine.session.spec import SessionSpec

TARGET = "tiny:1:48:2:64"


@dataclass
class RepeatDraft:
    """The context's last token, `gamma` times (at most `most` tokens a step)."""

    most: int
    name: str = "repeat"
    method: str = "repeat"

    def start(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, tokens: list[int], gamma: int, cfg: SamplingConfig, gen: torch.Generator | None) -> Proposal:
        return Proposal([tokens[-1]] * min(gamma, self.most) if tokens else [], None, 0)

    def commit(self, n_valid: int) -> None:
        pass


def _most(ref: str) -> int:
    rest = ref.partition(":")[2]
    if rest and not rest.isdigit():
        raise SettingsError(f"repeat draft '{ref}': write repeat or repeat:N, N the most tokens a step")
    return int(rest or 16)


KIND = DraftKind(
    "repeat", "last-token repetition", lambda ref: ref == "repeat" or ref.startswith("repeat:"),
    check_by_parsing(_most), lambda ref, target, loader, retokenize: RepeatDraft(_most(ref), name=ref),
    replays=True, offered="repeat", help="'repeat' proposes the last token again",
)  # fmt: skip


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> DraftKind:
    """The kind registered for this test only (the registry is put back as it was afterwards)."""
    monkeypatch.setattr(kinds, "_KINDS", list(kinds._KINDS))
    return register_draft_kind(KIND)


def test_it_is_claimed_checked_and_refused_where_it_does_not_run() -> None:
    assert draft_kind("repeat:3") is KIND and draft_kind("repeats") is kinds.MODEL
    spec = SessionSpec(target=TARGET, drafts=["repeat:3"], gammas=[2], dtype="float32")
    registry.validate(spec)
    with pytest.raises(SettingsError, match="write repeat or repeat:N"):
        registry.validate(SessionSpec(target=TARGET, drafts=["repeat:x"], gammas=[2]))
    with pytest.raises(SettingsError) as refused:
        registry.validate(SessionSpec(target="smollm2-135m", drafts=["repeat"], gammas=[2], engine="llama.cpp"))
    assert str(refused.value) == "llama.cpp has no last-token repetition: measure 'repeat' with the spectune engine"
    with pytest.raises(ValueError, match="already registered"):
        register_draft_kind(DraftKind("repeat", "another", lambda ref: False, KIND.check, KIND.build))


def test_the_cli_decodes_it_exactly_and_its_replay_matches(tmp_path, capsys) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("aaaa aaaa aaaa\nabc abc abc abc ab\n")
    out = tmp_path / "out.json"
    args = ["run", "--target", TARGET, "--draft", "repeat", "--prompts", str(prompts), "--max-new-tokens", "20",
            "--dtype", "float32", "--no-chat-template", "--json", str(out), "--policy", "heuristic:3"]  # fmt: skip
    assert cli(args) == 0, capsys.readouterr().err
    flat = json.loads(out.read_text())
    assert flat["draft"] == "repeat" and flat["c"] == 0.0
    assert all(d["identical"] for d in flat["divergences"]), flat["divergences"]
    assert flat["replayed"]["basis"] == "exact"
    assert flat["replayed"]["tokens_per_call"] == pytest.approx(flat["tokens_per_call"], abs=1e-12)
    assert cli([*args[:4], "repeat:x", *args[5:]]) == 2 and "write repeat or repeat:N" in capsys.readouterr().err


def test_the_replay_traces_it_and_ranks_policies_on_it(tiny_pair) -> None:
    target, _ = tiny_pair
    source = make_draft("repeat:4", target, loader=None)
    greedy = DecodeConfig(4, SamplingConfig(0.0), 24)
    traces = []
    for text in ("aaaa aaaa aaaa", "the cat sat on the mat and the cat"):
        ids = target.tokenizer.encode(text)
        live = decode_prompt(target, source, ids, greedy)[0]
        trace = draft_trace(source, ids, live.token_ids, 24)
        assert trace["method"] == "repeat" and len(trace["runs"]) == len(live.token_ids)
        assert all(p <= 4 for p in trace["proposable"]), trace["proposable"]
        traces.append(trace)
    ranked = {r.policy for r in compare_policies(traces, max_gamma=6).results}
    assert {"fixed:1", "fixed:4"} <= ranked and not any(p.startswith("confidence") for p in ranked)


def test_the_run_page_offers_and_queues_it_where_its_engine_runs_it(env) -> None:  # noqa: F811
    env.store.add_prompt_set("demo", "demo.jsonl", [{"text": "p1"}, {"text": "p2"}])
    at = page("pages/2_Run.py")
    at.radio(key="engine").set_value("spectune")
    at.run()
    choice = at.multiselect(key="drafts_choice")
    assert "repeat" in choice.options and "'repeat' proposes the last token again" in choice.help
    queue_drafts(at, ["repeat"])
    assert env.store.list_sessions()[0]["drafts"] == ["repeat"]
    from app.run_view import draft_options

    assert "repeat" not in draft_options("smollm2-135m", "llama.cpp") and "ngram" in draft_options(
        "smollm2-135m", "llama.cpp"
    )


def test_spectune_s_record_keeps_it_and_every_engine_without_it_turns_speculation_off() -> None:
    m = DraftMeasurement("repeat", "repeat", None, 0.6, [0.7, 0.6, 0.5], 0.0, {9: 1.2})
    rec = recommend([m], "latency", "memory-bound", gammas=range(1, 9))
    assert not rec.off and rec.method == "repeat"
    own = json.loads(export(rec, "spectune")[1])
    assert own["speculation"] == "repeat" and own["recommendation"]["gamma"] == rec.gamma
    for fmt in set(format_names()) - {"spectune"}:
        text = export(rec, fmt)[1]
        assert text.count("has no last-token repetition (repeat): this file turns speculation off") == 1, (fmt, text)
        assert "γ=" not in text, (fmt, text)
        if text.lstrip().startswith("{"):
            doc = json.loads(text)
            assert doc.get("speculative_config", "absent") is None or doc.get("speculation") == "off", (fmt, doc)
        else:
            flags = " ".join(line for line in text.splitlines() if not line.startswith("#"))
            assert "spec" not in flags and "-md" not in flags, (fmt, text)
