"""Model references and loading: bundled GGUF models, tiny in-process models, the pool that keeps them loaded."""
