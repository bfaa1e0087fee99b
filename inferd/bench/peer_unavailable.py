"""The error a peer raises when it cannot run (peers.py, llama_bench.py): its own module, below
both, because peers.py builds the llama-bench peer and llama-bench raises it."""

from __future__ import annotations


class PeerUnavailable(RuntimeError):
    """The peer's package is missing or cannot load the model; the benchmark goes on without it."""
