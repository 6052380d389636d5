"""What every served engine speaks: the OpenAI-compatible transport, its Prometheus metrics, load and server."""
