"""inferd: a readable, measurable LLM inference engine and OpenAI-compatible server.

The offline API keeps vLLM's names so scripts carry over:

    from inferd import LLM, SamplingParams
    llm = LLM()  # the embedded Gemma 3 270M
    out = llm.generate(["What is CUDA?"], SamplingParams(temperature=0, max_tokens=32))
"""

from __future__ import annotations

from inferd.version import __version__

# Imported lazily so `inferd --help` and config-only tools do not pay for importing torch.
_EXPORTS = {
    "LLM": "inferd.llm",
    "SamplingParams": "inferd.sampling_params",
    "RequestOutput": "inferd.outputs",
    "CompletionOutput": "inferd.outputs",
    "PoolingParams": "inferd.pooling_params",
    "EmbeddingRequestOutput": "inferd.outputs",
    "LoRARequest": "inferd.lora_request",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'inferd' has no attribute {name!r}")
