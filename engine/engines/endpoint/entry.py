"""The endpoint's registry entry: a running deployment measured as it is, with its URLs and caps as its options."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.engines.endpoint.settings import EndpointSessionSettings
from engine.engines.entry import EngineEntry
from engine.session.runner import RunKey
from engine.session.spec import SessionSpec


def _runner() -> Any:
    from engine.engines.endpoint.runner import EndpointRunner

    return EndpointRunner


def _validate(spec: SessionSpec, n_prompts: int | None = None) -> None:
    from engine.engines.endpoint.runner import validate_endpoint

    validate_endpoint(spec, n_prompts)


def _plan(spec: SessionSpec, levels: Sequence[int]) -> list[RunKey]:
    from engine.engines.endpoint.runner import plan_endpoint

    return plan_endpoint(spec, levels)


ENTRY = EngineEntry(
    "endpoint", "endpoint", "a running endpoint (OpenAI-compatible)", _validate, _runner, plan=_plan,
    deployment=True, options=EndpointSessionSettings,
)  # fmt: skip
