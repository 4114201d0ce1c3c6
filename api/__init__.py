"""HTTP service: sglang /v1/score and Cohere/Jina /v1/rerank over the engine (see api.app)."""
