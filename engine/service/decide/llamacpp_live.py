"""A speculation policy run for real in llama-server: the live figures the replay's predictions are checked against."""

from __future__ import annotations

from typing import Any

from engine.core.policy import parse_policy
from engine.engines.llamacpp.policy_flags import llamacpp_fields
from engine.errors import SpectuneError


def llamacpp_live(
    policy: Any,
    prompts: list[str],
    n_predict: int,
    target: str = "qwen2.5-coder-1.5b",
    draft: str = "qwen2.5-coder-0.5b",
    threads: int | None = None,
) -> dict[str, Any]:
    """Run a policy for real in llama-server (None: the target alone), greedy, prompt by prompt: tokens per target
    call from the server's counters, decode tokens/s, and each prompt's chat text and output token ids."""
    from engine.engines.llamacpp import client
    from engine.engines.llamacpp.launch import speculative_server
    from engine.engines.llamacpp.server import ManagedServer
    from engine.models.bundled import gguf_for

    parsed = parse_policy(policy) if isinstance(policy, str) else policy
    if parsed is not None and llamacpp_fields(parsed) is None:
        raise SpectuneError(f"llama.cpp cannot run {policy} as is: export it to see the closest it can run")
    draft_path = gguf_for(draft, "draft") if parsed is not None else None
    config = speculative_server(gguf_for(target, "target"), draft=draft_path, policy=parsed, threads=threads)
    with ManagedServer(config) as server:
        texts = [client.chat_prompt(server.url, p) for p in prompts]
        before = client.metrics(server.url)
        done = [client.complete(server.url, text, n_predict) for text in texts]
        counters = client.metrics(server.url).minus(before)
    seconds = sum(c.predicted_ms for c in done) / 1000.0
    tokens = sum(c.predicted_n for c in done)
    return {
        "policy": None if parsed is None else parsed.spec(),
        "tokens_per_call": counters.tokens_per_call() if parsed is not None else 1.0,
        "tokens_per_s": tokens / seconds if seconds else 0.0,
        "per_prompt_tokens_per_s": [c.predicted_n / (c.predicted_ms / 1000.0) if c.predicted_ms else 0.0 for c in done],
        "draft_tokens": sum(c.draft_n for c in done),
        "accepted": sum(c.draft_n_accepted for c in done),
        "chat_prompts": texts,
        "outputs": [c.token_ids for c in done],
    }
