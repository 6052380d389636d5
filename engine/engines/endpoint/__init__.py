"""A running OpenAI-compatible deployment under test: settings, a streaming load generator, its /metrics."""
