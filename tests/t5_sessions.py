"""Finished sessions with known numbers (the seed's T5 table) stored through the real store API."""

from __future__ import annotations

from typing import Any

# the seed's T5 table: α, c and the paper's measured speedup at γ=7
T5 = {"t5-small": (0.75, 0.02, 3.4), "t5-base": (0.80, 0.04, 2.8), "t5-large": (0.82, 0.11, 1.7)}


def store_session(
    store: Any,
    drafts: dict[str, tuple[float, float, float | None]],
    gamma: int = 7,
    regime: dict | None = None,
    name: str = "t5",
    verify_cost: dict | None = None,
    target: str = "t5-xxl",
    tokens_per_call: dict[str, float] | None = None,
) -> int:
    """A finished session with known α, c and measured speedup (or None) per draft; returns its id.

    `verify_cost` None stores an empty v(k) table, as the sweep does when v(k) was not measured;
    `tokens_per_call` gives a draft's mean acceptance length (tokens per target call) at `gamma`.
    """
    set_id, _, _ = store.add_prompt_set(name, f"{name}.txt", [{"text": f"translate this ({name})"}])
    sid = store.create_session(
        name=name, target=target, drafts=list(drafts), gammas=[gamma], temperatures=[0.0], max_new_tokens=32,
        prompt_set_id=set_id, n_prompts=1,
    )  # fmt: skip
    store.claim_next_session("test:1")
    base = store.create_run(sid, "none", 0, 0.0, "baseline")
    store.finish_run(base, {}, tokens_per_s=10.0, speedup_measured=1.0)
    for draft, (alpha, c, measured) in drafts.items():
        run = store.create_run(sid, draft, gamma, 0.0, "speculative")
        result = {"alpha": alpha, "c": c, "per_position_acceptance": [alpha] * gamma,
                  "verify_cost": verify_cost or {}, "tokens_per_call": (tokens_per_call or {}).get(draft),
                  "tokens_per_s": 10.0 * (measured or 1.0), "speedup_measured": measured}  # fmt: skip
        store.finish_run(run, result, **result)
    if regime is not None:
        store.set_regime(sid, regime)
    store.finish_session(sid, "done", summary={"verify_cost": {str(k): v for k, v in (verify_cost or {}).items()}})
    return sid
