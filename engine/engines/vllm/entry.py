"""vLLM's registry entry: a managed server that batches, measured at each concurrency, with options of its own."""

from __future__ import annotations

from typing import Any

from engine.engines.entry import EngineEntry
from engine.engines.vllm.options import VllmOptions
from engine.session.spec import SessionSpec


def _runner() -> Any:
    from engine.engines.vllm.runner import VllmRunner

    return VllmRunner


def _validate(spec: SessionSpec, n_prompts: int | None = None) -> None:
    from engine.engines.vllm.runner import validate_vllm

    validate_vllm(spec, n_prompts)


def _availability() -> tuple[bool, str]:
    from engine.engines.vllm.binaries import vllm_status

    found, line = vllm_status()
    if found is None:
        return False, f"vLLM is not available: {line}"
    return True, f"{line}: tokens/s, TTFT and acceptance at each concurrency; β per position is not reported."


def _stop_all() -> int:
    from engine.engines.vllm.server import stop_all

    return stop_all()


ENTRY = EngineEntry(
    "vllm", "vllm", "vLLM (managed server)", _validate, _runner, availability=_availability, export_format="vllm",
    batches=True, stop_processes=_stop_all, processes="vLLM server(s)", options=VllmOptions,
)  # fmt: skip
