"""llama.cpp's registry entry: a llama-server per configuration, its policies, its memory and its processes."""

from __future__ import annotations

from typing import Any

from engine.engines.entry import EngineEntry
from engine.session.runner import RunKey
from engine.session.spec import SessionSpec


def _runner() -> Any:
    from engine.engines.llamacpp.runner import LlamaCppRunner

    return LlamaCppRunner


def _validate(spec: SessionSpec, n_prompts: int | None = None) -> None:
    from engine.engines.llamacpp.runner import validate_llamacpp

    validate_llamacpp(spec, n_prompts)


def _runs_policy(policy: str) -> bool:
    from engine.engines.llamacpp.policy_flags import llamacpp_fields

    return llamacpp_fields(policy) is not None


def _memory(spec: SessionSpec, plan: list[RunKey]) -> tuple[int, str]:
    from engine.engines.llamacpp.runner import memory_before

    return memory_before(spec, plan)


def _stop_all() -> int:
    from engine.engines.llamacpp.server import stop_all

    return stop_all()


def _availability() -> tuple[bool, str]:
    from engine.engines.llamacpp.binaries import llama_status

    build, line = llama_status()
    if build is None:
        return False, f"llama.cpp is not available: {line}"
    return True, f"{line}: c, v(k) and speed as llama.cpp measures them; β per position is not reported."


ENTRY = EngineEntry(
    "llama.cpp", "llamacpp", "llama.cpp (llama-server)", _validate, _runner, runs_policies=True,
    fixed_weights="GGUF as it is (quantised)", availability=_availability, export_format="llamacpp",
    runs_policy=_runs_policy, two_width_probe=True, memory=_memory, stop_processes=_stop_all,
    processes="llama-server process(es)",
)  # fmt: skip
