"""Run by test_cpu_independence.py in a fresh process (whose environment picks the CPU code):
the default mode's logits of every step for PROMPTS, saved with torch.save.

    python tests/parity/logits_probe.py MODEL|- OUT.pt      (-: the embedded model)
"""

from __future__ import annotations

import sys

import torch

from inferd import LLM, SamplingParams

PROMPTS = ["What is CUDA?", "The capital of France is", " ".join(["tokens"] * 90)]
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def step_logits(llm: LLM, prompts=PROMPTS) -> list[torch.Tensor]:
    """The logits of each step of one greedy run of `prompts` (the KV cache reset first)."""
    model, seen = llm.engine.runner.model, []
    compute = model.compute_logits

    def keep(hidden: torch.Tensor) -> torch.Tensor:
        seen.append(compute(hidden).clone())
        return seen[-1]

    model.compute_logits = keep
    try:
        llm.engine.kv.reset_prefix_cache()
        llm.generate(prompts, PARAMS, use_tqdm=False)
    finally:
        del model.compute_logits  # the class's method again
    return seen


if __name__ == "__main__":
    model, out = sys.argv[1], sys.argv[2]
    llm = LLM(model=None if model == "-" else model, kv_cache_memory=64 << 20)
    torch.save(step_logits(llm), out)
