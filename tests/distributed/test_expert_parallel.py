"""Expert parallelism on CPU: a Mixture-of-Experts model over 2 processes (gloo on loopback),
each rank holding half of every layer's experts whole (attention split by heads, a shared
expert by its intermediate features), gives the tokens of one process."""

from __future__ import annotations

import torch
from tiny_models import make_tiny_checkpoint

from inferd import LLM, SamplingParams
from inferd.engine.execution.runner import SequenceStep

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
PROMPTS = [[1, 17, 250, 33, 98, 5, 77, 120, 200, 41, 9, 63], [1, 5, 6], [1] + list(range(40, 80))]


def _outputs(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def _prompt_logits(llm: LLM, prompt: list[int]) -> torch.Tensor:
    engine = llm.engine
    tables = [list(range(1, 1 + -(-len(prompt) // 16)))] * len(engine.runner.kv_caches)
    engine.runner.clear_blocks(tables)
    return engine.runner.execute([SequenceStep(prompt, 0, tables)])[0]


def test_expert_parallel_2_matches_one_process(tmp_path):
    # Qwen2-MoE: 8 experts top-2, a shared expert with its gate, q/k/v biases, and (layer 1) a
    # dense MLP between two sparse layers: every kind of split in one pair of processes.
    folder = make_tiny_checkpoint("qwen2_moe", tmp_path / "moe", mlp_only_layers=[1])
    kw = dict(model=str(folder), dtype="float32", kv_cache_memory=8 << 20, max_model_len=128,
              enable_prefix_caching=False)  # fmt: skip
    one = LLM(**kw)
    two = LLM(tensor_parallel_size=2, **kw)
    try:
        assert _outputs(two) == _outputs(one)
        torch.testing.assert_close(
            _prompt_logits(two, PROMPTS[2]), _prompt_logits(one, PROMPTS[2]), rtol=1e-5, atol=1e-5
        )
        reports = two.engine.runner.reports()
        assert [r["rank"] for r in reports] == [0, 1] and len({r["pid"] for r in reports}) == 2
        # every rank holds half the experts: together a little more than one model (the
        # router, norms and embeddings' replicated parts aside, everything is split)
        whole = sum(p.numel() * p.element_size() for p in one.engine.runner.model.parameters())
        assert all(0.45 * whole < r["weight_bytes"] < 0.6 * whole for r in reports), reports
    finally:
        two.shutdown()
