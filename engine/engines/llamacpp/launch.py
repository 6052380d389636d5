"""The one place a llama-server's speculation is decided: target alone, n-gram lookup, or a draft model under a
policy llama-server runs as is. Every caller (session runner, `serve`, policy checks, exports) builds its
ServerConfig here; ServerConfig.flags() turns it into command-line flags."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.core.policy import FixedGamma, SpeculationPolicy
from engine.drafts.kinds import draft_kind
from engine.drafts.refs import parse_ngram_spec
from engine.engines.llamacpp.policy_flags import llamacpp_fields, unmappable
from engine.engines.llamacpp.server import ServerConfig
from engine.errors import SettingsError


def ngram_simple_size(window: tuple[int, int]) -> int:
    """The one n-gram length llama.cpp's ngram-simple looks up for a (shortest, longest) window: the longest.

    ngram-simple matches exactly --spec-ngram-simple-size-n tokens and has no shorter fallback, so a window's
    shorter lengths are not looked up in llama.cpp (exports say so where the measurement looked them up)."""
    shortest, longest = window
    if not 1 <= shortest <= longest:
        raise SettingsError(f"n-gram window {shortest}-{longest}: need 1 <= shortest <= longest")
    return longest


# the draft kinds llama-server looks up in the context itself, by method: their speculative_server settings
LOOKUPS: dict[str, Callable[[str], dict[str, Any]]] = {"ngram": lambda ref: {"ngram_window": parse_ngram_spec(ref)}}


def server_for_draft(
    model: Path, ref: str, policy: SpeculationPolicy, locate: Callable[[str, str], Path], **common: Any
) -> ServerConfig:
    """A llama-server for `model` speculating with draft reference `ref` under `policy` (a kind that does not
    speculate: the target alone). A kind that needs a model loads its GGUF (`locate(ref, "draft")`); one llama-server
    looks up itself takes its settings from LOOKUPS; any other kind is refused (SettingsError)."""
    kind = draft_kind(ref)
    if not kind.speculates:
        return speculative_server(model, **common)
    if kind.needs_model:
        return speculative_server(model, draft=locate(ref, "draft"), policy=policy, **common)
    if kind.method in LOOKUPS:
        return speculative_server(model, policy=policy, **LOOKUPS[kind.method](ref), **common)
    raise SettingsError(kind.refused_by("llama.cpp", ref) or f"llama-server has no lookup settings for {kind.label}")


def speculative_server(
    model: Path,
    *,
    draft: Path | None = None,
    ngram_window: tuple[int, int] | None = None,
    policy: SpeculationPolicy | None = None,
    **common: Any,
) -> ServerConfig:
    """A llama-server for `model`: the target alone (neither `draft` nor `ngram_window`); n-gram lookup of the
    (shortest, longest) n-gram window `ngram_window` drafting the fixed γ of `policy`; or draft model `draft` under
    `policy`.

    `common` is passed to ServerConfig as is (threads, ctx_size, parallel, extra)."""
    if draft is None and ngram_window is None:
        return ServerConfig(model, **common)
    policy = policy or FixedGamma(1)
    if ngram_window is not None:
        gamma = policy.fixed_gamma()
        if gamma is None:
            raise SettingsError(f"llama.cpp's n-gram lookup drafts a fixed γ, not {policy.spec()}")
        return ServerConfig(
            model,
            spec_type="ngram-simple",
            draft_n_max=gamma,
            draft_n_min=0,
            ngram_size_n=ngram_simple_size(ngram_window),
            ngram_size_m=gamma,
            **common,
        )
    fields = llamacpp_fields(policy)
    if fields is None:
        raise SettingsError(unmappable(policy))
    return ServerConfig(model, draft=draft, spec_type="draft-simple", **fields, **common)
