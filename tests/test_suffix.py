"""Suffix decoding (engine/drafts/suffix.py): Arctic Inference's trees driven as vLLM drives them, its references,
and exactness in the loop (greedy output = the target's; at T > 0 the target's distribution with a one-hot q)."""

from __future__ import annotations

import pytest
from conftest import REAL_PROMPTS, greedy_config, real_pair
from test_sampling_distribution import CFG, chi_square_p, exact_joint, sampled_joint

from engine.core.decoder import DecodeConfig, decode_prompt
from engine.core.sampling import SamplingConfig
from engine.drafts.factory import for_one_run, make_draft
from engine.drafts.kinds import draft_method
from engine.drafts.refs import SuffixParams, parse_suffix_spec, suffix_ref
from engine.drafts.suffix import SuffixDraft, suffix_runs
from engine.errors import SettingsError
from engine.models.chat import encode_prompt
from engine.models.tiny import load_tiny


def request(draft: SuffixDraft, prompt: list[int], response: list[int]) -> None:
    """One finished request: its prompt, then its response learnt token by token as the loop feeds it."""
    draft.start(prompt)
    for t in range(len(response) + 1):
        draft.lookup(prompt + response[:t], 0)
    draft.finish(prompt + response)


def test_prompt_tree_hand_worked():
    """Prompt 1 2 3 4 5 1 2 3: the longest matched suffix is '1 2 3' (3 tokens; '4 5 1 2 3' is not a suffix),
    two suffixes pass through it and one goes on to 4, so each drafted token has probability 1/2."""
    draft = SuffixDraft()
    prompt = [1, 2, 3, 4, 5, 1, 2, 3]
    draft.start(prompt)
    assert draft.lookup(prompt, 8) == [4, 5, 1]  # spec factor 1.0: at most 1.0 × match length 3
    assert draft.lookup(prompt, 2) == [4, 5]  # at most γ
    wide = SuffixDraft(SuffixParams(max_spec_factor=2.0))
    wide.start(prompt)
    assert wide.lookup(prompt, 8) == [4, 5, 1, 2, 3]  # up to 6, but the only path ends after 5 tokens
    strict = SuffixDraft(SuffixParams(min_token_prob=0.6))
    strict.start(prompt)
    assert strict.lookup(prompt, 8) == []  # 1/2 < 0.6: nothing is likely enough
    # the 4 joins the tree: '4', '3 4', '2 3 4', '1 2 3 4' each occur twice (once at the end), so they draft
    # 5 | 5 1 | 5 1 2 | 5 1 2 3 at probability 1/2 each (scores 0.5 … 2.0); '5 1 2 3 4' occurs only at the end
    # (nothing follows, score 0): the best score, the match of length 4, wins
    assert draft.lookup(prompt + [4], 8) == [5, 1, 2, 3]


def test_most_frequent_continuation_wins():
    """'5 1' is followed by 2 twice and by 3 once (and ends the text once): the draft follows 2 (probability 2/4);
    every longer suffix of the context occurs only at its end, so its empty draft scores 0 and loses."""
    draft = SuffixDraft(SuffixParams(max_spec_factor=4.0))
    prompt = [8, 5, 1, 2, 7, 5, 1, 3, 6, 5, 1, 2, 4, 5, 1]
    draft.start(prompt)
    assert draft.lookup(prompt, 1) == [2]


def test_a_longer_match_wins_a_tie():
    """'2 9 1' was followed by 3 and '9 1' mostly by 2, both at probability 1/2: the longer match decides."""
    draft = SuffixDraft(SuffixParams(max_spec_factor=4.0))
    prompt = [9, 1, 2, 9, 1, 3, 9, 1, 2, 9, 1]
    draft.start(prompt)
    assert draft.lookup(prompt, 1) == [3]


def test_global_tree_learns_earlier_responses_in_order():
    """Request B's context ends in '3 4', which only request A's response holds: warm B drafts A's next tokens;
    with the global tree off (CACHED 0, prompt tree only) B drafts nothing."""
    for cached, expected in ((10000, [5, 6]), (0, [])):
        draft = SuffixDraft(SuffixParams(max_cached_requests=cached))
        request(draft, [1, 2], [3, 4, 5, 6])
        draft.start([9, 3, 4])
        assert draft.lookup([9, 3, 4], 4) == expected
        draft.finish([9, 3, 4])
        assert [r.cached_before for r in draft.requests] == [0, 1 if cached else 0]
        assert [r.warm for r in draft.requests] == [False, bool(cached)]


def test_global_tree_evicts_the_oldest_response():
    draft = SuffixDraft(SuffixParams(max_cached_requests=1))
    request(draft, [1], [3, 4, 5, 6])
    request(draft, [1], [7, 8, 9])
    draft.start([0, 3, 4])  # A's response was evicted when this request took the one slot
    assert draft.lookup([0, 3, 4], 4) == []
    assert draft.cached_requests == 1


def test_fresh_run_starts_cold_and_make_draft_builds_it():
    target = load_tiny("tiny:1:48:2:64")
    draft = make_draft("suffix:16:2:0.2:5", target, loader=None)
    assert isinstance(draft, SuffixDraft) and draft.method == "suffix"
    assert draft.params == SuffixParams(16, 2.0, 0.2, 5)
    request(draft, [1, 2], [3, 4, 5, 6])
    fresh = for_one_run(draft)
    assert fresh is not draft and fresh.params == draft.params and fresh.cached_requests == 0


@pytest.mark.parametrize(
    ("ref", "params"),
    [
        ("suffix", SuffixParams()),
        ("suffix:12", SuffixParams(max_tree_depth=12)),
        ("suffix:24:1.5", SuffixParams(max_spec_factor=1.5)),
        ("suffix:24:1:0.3", SuffixParams(min_token_prob=0.3)),
        ("suffix:24:1:0.1:0", SuffixParams(max_cached_requests=0)),
    ],
)
def test_suffix_refs_parse_and_round_trip(ref, params):
    assert parse_suffix_spec(ref) == params
    assert parse_suffix_spec(suffix_ref(params)) == params
    assert draft_method(ref) == "suffix"


@pytest.mark.parametrize(
    "ref",
    ["suffix:0", "suffix:abc", "suffix:24:0", "suffix:24:1:2", "suffix:24:1:0.1:-1", "suffix:", "suffix:1:2:3:4:5"],
)
def test_bad_suffix_refs_are_settings_errors(ref):
    with pytest.raises(SettingsError, match="suffix"):
        parse_suffix_spec(ref)


def test_draft_methods_of_refs():
    assert [draft_method(r) for r in ("none", "ngram", "ngram:1-3", "suffix", "tiny:1")] == [
        "none", "ngram", "ngram", "suffix", "draft_model"
    ]  # fmt: skip


@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_greedy_suffix_equals_target_alone(tiny_pair, gamma):
    """Several prompts through one cache (warm after the first): every output is the target's greedy output."""
    target, _ = tiny_pair
    source = SuffixDraft()
    cfg = DecodeConfig(gamma, SamplingConfig(0.0), 40, stop_on_eos=False)
    accepted = drafted = 0
    for text in ("abcabcabc", "hello hello", "abcab", "xyzxyz"):
        ids = target.tokenizer.encode(text)
        base, _ = decode_prompt(target, None, ids, DecodeConfig(0, SamplingConfig(0.0), 40, stop_on_eos=False))
        out, steps = decode_prompt(target, source, ids, cfg)
        assert out.token_ids == base.token_ids
        accepted += sum(s.accepted for s in steps)
        drafted += sum(s.gamma for s in steps)
    assert drafted > 0 and accepted > 0
    assert [r.warm for r in source.requests] == [False, True, True, True]


def test_suffix_runs_follow_the_live_drafts(tiny_pair):
    """The trace's runs along a greedy output are what the live loop accepts at γ = cap."""
    target, _ = tiny_pair
    ids = target.tokenizer.encode("abcabcabc")
    gamma = 4
    cfg = DecodeConfig(gamma, SamplingConfig(0.0), 40, stop_on_eos=False)
    live, steps = decode_prompt(target, SuffixDraft(), ids, cfg)
    runs, proposable = suffix_runs(SuffixDraft(), ids, live.token_ids, [gamma])[gamma]
    t = 0
    for step in steps:
        assert step.gamma == min(proposable[t], 40 - t - 1)
        assert step.accepted == min(runs[t], step.gamma)
        t += step.emitted


def test_one_hot_suffix_proposals_follow_target_distribution():
    """At T = 1 the suffix draft (q one-hot, its cache learning from every sample) leaves the target's joint
    distribution of the first two tokens unchanged."""
    target = load_tiny("tiny:11:8:1:16", logit_scale=3.0)
    ids = target.tokenizer.encode("abcab")
    source = SuffixDraft(SuffixParams(max_spec_factor=2.0, min_token_prob=0.0))
    counts = sampled_joint(target, source, ids, 2, CFG)
    assert chi_square_p(counts, exact_joint(target, ids, CFG)) > 1e-3
    assert source.cached_requests > 100  # it drafted from earlier samples' outputs


@pytest.fixture(scope="module")
def fp32_baselines():
    target, _ = real_pair("float32")
    encoded = [encode_prompt(target.tokenizer, text, True) for text in REAL_PROMPTS[::2]]
    return target, encoded, [decode_prompt(target, None, ids, greedy_config(0, 16))[0] for ids in encoded]


@pytest.mark.real_model
@pytest.mark.parametrize("gamma", [3, 8])
def test_fp32_suffix_is_exact(fp32_baselines, gamma):
    """The bundled Qwen 1.5B in fp32: suffix decoding over the prompts in order equals the target's greedy output."""
    target, encoded, baselines = fp32_baselines
    source = SuffixDraft()
    for ids, base in zip(encoded, baselines, strict=True):
        out, _ = decode_prompt(target, source, ids, greedy_config(gamma, 16))
        assert out.token_ids == base.token_ids
    assert [r.warm for r in source.requests] == [False, True]


@pytest.fixture(scope="module")
def suffix_session():
    """A session on a tiny target: suffix decoding with the global tree (warm after the first prompt) and without
    it (cold), at γ 2 and 4, over four prompts in file order."""
    from engine.engines import registry
    from engine.session.runner import PromptText
    from engine.session.spec import SessionSpec

    texts = ["abcabcabc", "hello hello hello", "abcab abcab", "the cat the cat"]
    prompts = [PromptText(f"p{i}", t, "") for i, t in enumerate(texts)]
    spec = SessionSpec(target="tiny:1:48:2:64", drafts=["suffix", "suffix:24:1:0.1:0"], gammas=[2, 4],
                       max_new_tokens=24, dtype="float32", chat_template=False, measure_verify_cost=False,
                       detect_regime=False)  # fmt: skip
    return texts, registry.sweep(spec, prompts).to_dict()


def test_session_records_prompt_order_and_cache_warmth(suffix_session):
    _, report = suffix_session
    state = report["suffix_cache"]
    assert state["prompt_order"] == ["p0", "p1", "p2", "p3"]
    assert [r["cached_before"] for r in state["runs"]["suffix γ=4 T=0"]] == [0, 1, 2, 3]  # warm from the 2nd
    assert [r["warm"] for r in state["runs"]["suffix:24:1:0.1:0 γ=4 T=0"]] == [False] * 4  # prompt tree only
    runs = {(r["draft"], r["gamma"]): r for r in report["runs"]}
    assert all(r["method"] == "suffix" and r["c"] == 0.0 for r in runs.values())
    assert all(d["verdict"] == "identical" for r in runs.values() for d in r["divergences"])


def test_replay_of_suffix_traces_equals_the_live_runs(suffix_session):
    """The trace recorded along the baseline's outputs, prompts in the session's order from an empty cache, replays
    each live run's tokens per call exactly (T = 0), warm and cold."""
    from engine.analysis.policy_replay import replay, trace_usable
    from engine.core.policy import FixedGamma
    from engine.measure.agreement import draft_trace

    texts, report = suffix_session
    target = load_tiny("tiny:1:48:2:64")
    outputs = report["baseline"]["outputs"]
    for ref in ("suffix", "suffix:24:1:0.1:0"):
        source = SuffixDraft(parse_suffix_spec(ref))
        pairs = zip(texts, outputs, strict=True)
        traces = [draft_trace(source, target.tokenizer.encode(t), o["token_ids"], 24) for t, o in pairs]
        assert all(trace_usable(t) and t["method"] == "suffix" for t in traces)
        assert [t["cached_before"] for t in traces] == ([0, 1, 2, 3] if ref == "suffix" else [0, 0, 0, 0])
        for run in (r for r in report["runs"] if r["draft"] == ref):
            replayed = replay(traces, FixedGamma(run["gamma"])).tokens_per_call
            assert replayed == pytest.approx(run["tokens_per_call"], abs=1e-9), (ref, run["gamma"])


def test_cli_rejects_bad_suffix_specs_with_one_line(tmp_path):
    import subprocess
    import sys

    prompts = tmp_path / "p.txt"
    prompts.write_text("abc\n")
    for ref in ("suffix:0", "suffix:abc"):
        r = subprocess.run(
            [sys.executable, "-m", "engine", "run", "--target", "tiny:1", "--draft", ref, "--prompts", str(prompts),
             "--json", str(tmp_path / "o.json")],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert r.stderr.startswith("error: ") and "suffix" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_the_parameter_grid_replays_what_each_point_does_live(tiny_pair):
    """From one recorded pass (the target's greedy outputs), every grid point's tokens per call equal a live run
    with those parameters over the same prompts in the same order."""
    from engine.analysis.suffix_grid import suffix_grid

    target, _ = tiny_pair
    prompts = [target.tokenizer.encode(t) for t in ("abcabcabc", "hello hello", "abcab abcab")]
    plain = DecodeConfig(0, SamplingConfig(0.0), 24, stop_on_eos=False)
    outputs = [decode_prompt(target, None, ids, plain)[0].token_ids for ids in prompts]
    grid = [SuffixParams(8, 0.5, 0.3, 0), SuffixParams(24, 2.0, 0.0, 10000), SuffixParams()]
    points = suffix_grid(prompts, outputs, gammas=(2, 6), grid=grid)
    assert len(points) == 6 and points[0].tokens_per_call >= points[-1].tokens_per_call
    for point in points:
        live = SuffixDraft(point.params)
        emitted = calls = 0
        for ids, out in zip(prompts, outputs, strict=True):
            got, steps = decode_prompt(target, live, ids, DecodeConfig(point.gamma, SamplingConfig(0.0), 24,
                                                                        stop_on_eos=False))  # fmt: skip
            assert got.token_ids == out
            emitted, calls = emitted + len(got.token_ids), calls + len(steps)
        assert point.tokens_per_call == pytest.approx(emitted / calls), point
