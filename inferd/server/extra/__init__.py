"""vLLM's routes beyond the APIs: /generate, /tokenize, /health, LoRA loading, profiling."""
