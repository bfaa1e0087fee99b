"""Prefill/decode disaggregation: prompts computed on prefill engines, their KV handed to decode
engines through the KV connector's transfer tier (docs/distributed.md)."""
