"""What a Mixture of Experts costs per decode step next to the dense model of equal active
parameters: 8 experts, top-2, hidden 512, 4 layers (expert intermediate I) vs the same model with
one dense MLP of intermediate 2 I (the same multiply-adds per token; the MoE adds its router).

    python scripts/moe_decode_cost.py                  # float32 and bfloat16 weights
    python scripts/moe_decode_cost.py --batch 1 8 --steps 200 --dtype float32

Figures are CPU time (time.process_time) of one whole decode step through the engine's model
runner (attention over a 64-token context, the LM head, everything), one thread, median of
`--steps`, both models measured alternately in the same run: quote the ratio, not the times
(docs/performance.md). Random weights; nothing is loaded from disk.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from inferd.config import ModelConfig, MoEConfig
from inferd.cpu_info import cpu_flags, cpu_model
from inferd.engine.execution.runner import ModelRunner, SequenceStep
from inferd.models.llama import LlamaForCausalLM


def configs(hidden: int, layers: int, experts: int, top_k: int, inter: int, vocab: int):
    common = dict(vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=8,
                  num_kv_heads=2, head_dim=hidden // 8, max_position_embeddings=4096)  # fmt: skip
    moe = ModelConfig("qwen3_moe", intermediate_size=inter,
                      moe=MoEConfig(experts, top_k, inter, True), **common)  # fmt: skip
    dense = ModelConfig("llama", intermediate_size=top_k * inter, **common)
    return moe, dense


def random_model(config: ModelConfig, dtype: torch.dtype) -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(config, dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape) * 0.05 + (1.0 if p.dim() == 1 else 0.0))
    model.finalize()
    return model.eval()


class Decoder:
    """`batch` sequences with a 64-token context, decoding one token each per step."""

    def __init__(self, model, batch: int, dtype: torch.dtype):
        self.runner = ModelRunner(model, [batch * 8 + 1], 16, dtype, torch.device("cpu"))
        self.tables = [[list(range(1 + 8 * i, 9 + 8 * i))] for i in range(batch)]
        prompts = [[(7 * i + j) % 1000 for j in range(64)] for i in range(batch)]
        self.runner.execute([SequenceStep(p, 0, t) for p, t in zip(prompts, self.tables)])
        self.step_no = 0

    def step(self) -> float:
        """CPU seconds of one decode step (the position stays within the blocks: reused)."""
        pos = 64 + self.step_no % 32
        self.step_no += 1
        steps = [SequenceStep([pos % 1000], pos, t) for t in self.tables]
        start = time.process_time()
        self.runner.execute(steps)
        return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--expert-intermediate", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=8192)
    args = parser.parse_args()
    torch.set_num_threads(1)
    moe_cfg, dense_cfg = configs(args.hidden, args.layers, args.experts, args.top_k,
                                 args.expert_intermediate, args.vocab)  # fmt: skip
    features = " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx", "amx"))))
    print(f"{cpu_model()}; torch {torch.__version__}, 1 thread; CPU features: {features}")
    print(f"MoE: {args.experts} experts, top-{args.top_k}, hidden {args.hidden}, {args.layers} "
          f"layers, expert intermediate {args.expert_intermediate}; dense: intermediate "
          f"{args.top_k * args.expert_intermediate}; vocab {args.vocab}")  # fmt: skip
    print(f"{'dtype':9} {'batch':>5} {'dense ms':>9} {'MoE ms':>8} {'MoE/dense':>9}")
    for name in args.dtype:
        dtype = getattr(torch, name)
        models = {k: random_model(c, dtype) for k, c in (("moe", moe_cfg), ("dense", dense_cfg))}
        for batch in args.batch:
            decoders = {k: Decoder(m, batch, dtype) for k, m in models.items()}
            times: dict[str, list[float]] = {"moe": [], "dense": []}
            for _ in range(5):  # warm-up
                for d in decoders.values():
                    d.step()
            for _ in range(args.steps):  # alternate, so both see the same machine
                for k, d in decoders.items():
                    times[k].append(d.step())
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            print(f"{name:9} {batch:5} {med['dense']:9.3f} {med['moe']:8.3f} "
                  f"{med['moe'] / med['dense']:9.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
