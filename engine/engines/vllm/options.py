"""A vLLM session's own options: its compute cores, its KV cache, the longest sequence, and eager or compiled."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.core.engine_options import EngineOptions
from engine.errors import SettingsError


@dataclass
class VllmOptions(EngineOptions):
    """A vLLM session's own settings (engine.engines.vllm.server.VllmConfig): its compute cores (None: every core),
    the KV cache it may hold, the longest sequence, and whether to skip torch.compile (start-up ≈2 min faster)."""

    stored_as = "vllm"

    threads: int | None = None
    kv_cache_mib: int = 512
    max_model_len: int = 4096
    enforce_eager: bool = True

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--vllm-threads",
            type=int,
            default=None,
            help="vLLM: compute cores (default every core, as llama-server's -t); see docs/engines.md",
        )

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> VllmOptions:
        return cls(threads=values.get("vllm_threads"))

    def checked(self, spec: Any = None) -> VllmOptions:
        if self.threads is not None and not 1 <= self.threads <= 1024:
            raise SettingsError(f"vLLM threads = {self.threads}: 1 to 1024, or none for every core")
        if not 64 <= self.kv_cache_mib <= 1 << 20:
            raise SettingsError(f"vLLM KV cache = {self.kv_cache_mib} MiB: at least 64")
        if not 128 <= self.max_model_len <= 1 << 20:
            raise SettingsError(f"vLLM max model length = {self.max_model_len}: at least 128")
        return self
