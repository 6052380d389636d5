"""vLLM as an engine: the installed vLLM, the vLLM servers we manage (and their guard), their HTTP client."""
