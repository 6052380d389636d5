"""The decoding loop and its parts: verification, proposals, the KV cache, sampling, step records."""
