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


def speculative_server(
    model: Path,
    *,
    draft: Path | None = None,
    ngram_size: int | None = None,
    policy: SpeculationPolicy | None = None,
    **common: Any,
) -> ServerConfig:
    """A llama-server for `model`: the target alone (neither `draft` nor `ngram_size`); n-gram lookup with look-up
    length `ngram_size` drafting up to the fixed γ of `policy`; or draft model `draft` under `policy`.

    `common` is passed to ServerConfig as is (threads, ctx_size, parallel, extra)."""
    if draft is None and ngram_size is None:
        return ServerConfig(model, **common)
    policy = policy or FixedGamma(1)
    if ngram_size is not None:
        if not isinstance(policy, FixedGamma):
            raise SettingsError(f"llama.cpp's n-gram lookup drafts a fixed γ, not {policy.spec()}")
        gamma = policy.gamma
        return ServerConfig(model, spec_type="ngram-simple", draft_n_max=gamma, draft_n_min=0,
                            ngram_size_n=ngram_size, ngram_size_m=gamma, **common)  # fmt: skip
    fields = llamacpp_fields(policy)
    if fields is None:
        raise SettingsError(unmappable(policy))
    return ServerConfig(model, draft=draft, spec_type="draft-simple", **fields, **common)
