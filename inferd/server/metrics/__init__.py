"""Prometheus metrics (vLLM's names), step timings, request timelines."""
