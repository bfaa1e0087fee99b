"""Memory accounting: what a model costs (weights, KV cache, activations, overhead)."""
