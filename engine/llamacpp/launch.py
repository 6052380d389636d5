"""The one place a llama-server's speculation is decided: target alone, n-gram lookup, or a draft model under a
policy llama-server runs as is. Every caller (session runner, `serve`, policy checks, exports) builds its
ServerConfig here; ServerConfig.flags() turns it into command-line flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.core.policy import FixedGamma, SpeculationPolicy
from engine.errors import SettingsError
from engine.llamacpp.policy_flags import llamacpp_fields, unmappable
from engine.llamacpp.server import ServerConfig


def ngram_simple_size(window: tuple[int, int]) -> int:
    """The one n-gram length llama.cpp's ngram-simple looks up for a (shortest, longest) window: the longest.

    ngram-simple matches exactly --spec-ngram-simple-size-n tokens and has no shorter fallback, so a window's
    shorter lengths are not looked up in llama.cpp (exports say so where the measurement looked them up)."""
    shortest, longest = window
    if not 1 <= shortest <= longest:
        raise SettingsError(f"n-gram window {shortest}-{longest}: need 1 <= shortest <= longest")
    return longest


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
        return ServerConfig(model, spec_type="ngram-simple", draft_n_max=gamma, draft_n_min=0,
                            ngram_size_n=ngram_simple_size(ngram_window), ngram_size_m=gamma, **common)  # fmt: skip
    fields = llamacpp_fields(policy)
    if fields is None:
        raise SettingsError(unmappable(policy))
    return ServerConfig(model, draft=draft, spec_type="draft-simple", **fields, **common)
