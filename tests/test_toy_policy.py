"""A kind of speculation policy added in this one file, and found everywhere a policy is offered.

`Alternate` drafts G tokens, then 1, in turn. Registered once through `register_policy_kind`, with nothing
changed anywhere else, it is: parsed and run by the CLI's `run --policy` in spectune's loop, and replayed to the
same figures; tried by the policy replay's grid; queued from the Run page; and exported to llama.cpp and
transformers as their closest setting, each saying what it cannot run, and to spectune's own file as itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from test_app_pages import assert_clean, env, fill_run_form, page, texts  # noqa: F401  (env is a fixture)
from test_export import draft_rec

import engine.core.policy as policy_registry
from engine.analysis.export import export_policy
from engine.analysis.policy_replay import compare_policies
from engine.core.decoder import DecodeConfig, decode_prompt
from engine.core.policy import DraftControls, GridAsk, PolicyKind, go, parse_policy, register_policy_kind
from engine.core.sampling import SamplingConfig
from engine.drafts.model import ModelDraft
from engine.measure.agreement import draft_trace
from engine.service.cli.main import main as cli

TARGET = "tiny:1:48:2:64"
DRAFT = "tiny:1:48:2:64~0.15"


@dataclass(frozen=True)
class Alternate:
    """G draft tokens on even steps, 1 on odd ones; the step count carries over the run's prompts."""

    high: int = 4
    kind: ClassVar[str] = "alternate"
    uses_confidence: ClassVar[bool] = False
    varies_per_step: ClassVar[bool] = True
    carries_state: ClassVar[bool] = True
    min_draft: int = 0

    def fixed_gamma(self) -> int | None:
        return None

    def batch_schedule(self) -> dict[int, int] | None:
        return None

    def spec(self) -> str:
        return f"alternate:{self.high}"

    def describe(self) -> str:
        return f"{self.high}, then 1, in turn"

    def controls(self) -> DraftControls:
        return DraftControls(self.high, beyond=(("alternating γ", f"{self.high} and 1 in turn"),))

    def max_draft(self) -> int:
        return self.high

    def start(self) -> int:
        return 0

    def length(self, state: int) -> int:
        return self.high if state % 2 == 0 else 1

    stop = staticmethod(go)

    def update(self, state: int, drafted: int, accepted: int) -> int:
        return state + 1


def _parse(rest: str, default_gamma: int) -> Alternate:
    if rest and not rest.isdigit():
        raise ValueError(f"alternate policy: '{rest}' is not a whole number (write alternate:G)")
    return Alternate(int(rest) if rest else default_gamma)


def _grid(ask: GridAsk) -> list[Any]:
    return [Alternate(g) for g in (2, 4) if g <= ask.max_gamma]


KIND = PolicyKind("alternate", "alternate:G", "G and 1 draft tokens in turn", _parse, _grid, simplicity=5)


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> PolicyKind:
    """The kind registered for this test only (the registry is put back as it was afterwards)."""
    monkeypatch.setattr(policy_registry, "_KINDS", dict(policy_registry._KINDS))
    return register_policy_kind(KIND)


def test_it_parses_describes_and_is_named_in_every_help_line() -> None:
    policy = parse_policy("alternate:3")
    assert policy == Alternate(3) and policy.spec() == "alternate:3" and policy_registry.describe(policy)
    assert "alternate:G" in policy_registry.grammar()
    with pytest.raises(ValueError, match="alternate policy"):
        parse_policy("alternate:x")
    with pytest.raises(ValueError, match="a policy kind named 'alternate' is already registered"):
        register_policy_kind(PolicyKind("alternate", "alternate:G", "another", _parse, _grid, simplicity=1))


def test_the_cli_runs_it_in_spectune_s_loop_and_its_replay_matches(tmp_path, capsys) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello world, this is\nabc abc abc abc ab\n")
    out = tmp_path / "out.json"
    args = ["run", "--target", TARGET, "--draft", DRAFT, "--prompts", str(prompts), "--max-new-tokens", "20",
            "--dtype", "float32", "--no-chat-template", "--json", str(out), "--policy", "alternate:3"]  # fmt: skip
    assert cli(args) == 0, capsys.readouterr().err
    flat = json.loads(out.read_text())
    assert flat["policy"] == "alternate:3" and flat["draft_calls"] > 0
    assert 1 < flat["mean_drafted_per_step"] < 3  # 3 and 1 in turn
    assert flat["replayed"]["basis"] == "exact"
    assert flat["replayed"]["tokens_per_call"] == pytest.approx(flat["tokens_per_call"], abs=1e-12)
    assert cli([*args[:-1], "alternate:x"]) == 2 and "alternate policy" in capsys.readouterr().err


def test_the_replay_tries_it_beside_the_built_in_kinds(tiny_pair) -> None:
    target, draft = tiny_pair
    source = ModelDraft(draft, target.vocab_size)
    greedy = DecodeConfig(1, SamplingConfig(0.0), 24)
    traces = []
    for text in ("def add(a, b):", "the cat sat on the mat and the cat"):
        ids = target.tokenizer.encode(text)
        base = decode_prompt(target, None, ids, greedy)[0]
        traces.append(draft_trace(source, ids, base.token_ids, 24))
    ranked = {r.policy for r in compare_policies(traces, max_gamma=6).results}
    assert {"alternate:2", "alternate:4"} <= ranked and "fixed:3" in ranked and "heuristic:4" in ranked


def test_the_run_page_queues_it(env) -> None:  # noqa: F811
    env.store.add_prompt_set("demo", "demo.jsonl", [{"text": "p1"}, {"text": "p2"}])
    at = page("pages/2_Run.py")
    assert "alternate:G" in at.text_input(key="policies_text").help
    fill_run_form(at)
    at.text_input(key="policies_text").input("alternate:3 confidence:0.6:8:2")
    at.button(key="start_session").click()
    at.run()
    assert_clean(at)
    assert not at.error, texts(at.error)
    assert env.store.list_sessions()[0]["options"]["policies"] == ["alternate:3", "confidence:0.6:8:2"]


def test_each_export_runs_its_closest_setting_and_says_what_it_cannot() -> None:
    predicted = {"tokens_per_call": 2.1, "speedup": 1.4, "gain": 0.05, "best_fixed_gamma": 3, "basis": "exact"}

    def exported(fmt: str) -> str:
        file = export_policy(draft_rec(), Alternate(4), fmt, closest_gamma=3, predicted=predicted,
                             target="qwen2.5-coder-1.5b")  # fmt: skip
        return file.text

    flags = exported("llamacpp")
    assert "llama.cpp has no alternating γ: a fixed n-max 3 instead of 4 and 1 in turn" in flags
    assert "--spec-draft-n-max 3" in flags
    kwargs = exported("transformers")
    assert "transformers has no alternating γ: a constant 3 tokens instead of 4 and 1 in turn" in kwargs
    own = json.loads(exported("spectune"))
    assert own["policy"]["spec"] == "alternate:4" and own["policy"]["kind"] == "alternate"
