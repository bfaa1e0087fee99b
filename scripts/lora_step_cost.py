r"""CPU time of a 16-row decode step of the embedded model in the default mode (GGUF blocks, the
C decoder layer) with LoRA adapters beside the block products: the base model alone, then the
16 rows spread over 1, 4 and 8 distinct adapters (rank 16, all seven linear targets), one thread.

    python scripts/lora_step_cost.py                 # the embedded Gemma 3 270M
    python scripts/lora_step_cost.py --model smollm2-135m-instruct --dtype auto

CPU time of the calling thread (one OpenMP and one PyTorch thread), medians over interleaved
repeats, so the ratios to the base step are what to quote; the adapters are random (their values
do not change the cost). Prints the CPU features inferd's kernels use.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from inferd import LLM, LoRARequest  # noqa: E402
from inferd.engine.execution.runner import SequenceStep  # noqa: E402

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_adapter(folder: Path, shapes: dict, layers: int, rank: int, seed: int) -> Path:
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(layers):
        for module in TARGETS:
            out, inp = shapes[module]
            where = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            name = f"base_model.model.model.layers.{layer}.{where}.{module}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(rank, inp, generator=gen) * 0.01
            tensors[f"{name}.lora_B.weight"] = torch.randn(out, rank, generator=gen) * 0.01
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
              "target_modules": list(TARGETS)}  # fmt: skip
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--context", type=int, default=64, help="tokens cached per row")
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    torch.set_num_threads(1)
    llm = LLM(model=args.model, dtype=args.dtype, enable_lora=True, max_loras=8,
              max_lora_rank=16, kv_cache_memory=256 << 20, num_threads=1)  # fmt: skip
    runner = llm.engine.runner
    model = runner.model
    print("C decoder layer:", model.cpu_decoder is not None)
    from inferd.cpu_kernels.startup import prepare_cpu_kernels, status_line

    print("CPU kernels:", status_line(prepare_cpu_kernels(torch.device("cpu"))))
    lora = model.lora
    with tempfile.TemporaryDirectory() as tmp:
        for slot in range(1, 9):
            folder = write_adapter(Path(tmp) / f"a{slot}", lora.shapes(),
                                   model.config.num_layers, 16, slot)  # fmt: skip
            runner.load_adapters([(slot, LoRARequest(f"a{slot}", slot, str(folder)))])
    bs, rows, ctx = runner.block_size, args.rows, args.context
    per_row = ctx // bs + 2
    groups = len(model.config.kv_groups())
    tables = [[list(range(1 + i * per_row, 1 + (i + 1) * per_row))] * groups for i in range(rows)]
    prompt = [2] + [1000 + i for i in range(ctx - 1)]
    runner.execute([SequenceStep(prompt, 0, t) for t in tables])  # fill the cache once

    def step(distinct: int) -> float:
        slots = [0] * rows if distinct == 0 else [1 + i % distinct for i in range(rows)]
        steps = [SequenceStep([1234], ctx, t, adapter_slot=s) for t, s in zip(tables, slots)]
        t0 = time.thread_time()
        runner.execute(steps)
        return time.thread_time() - t0

    cases = [0, 1, 4, 8]
    times: dict[int, list[float]] = {c: [] for c in cases}
    for c in cases:
        step(c)  # warm
    for _ in range(args.repeats):
        for c in cases:
            times[c].append(step(c))
    base = statistics.median(times[0])
    print(f"{rows}-row decode step, context {ctx}, rank 16, all linear targets "
          "(CPU time, one thread; provisional on a shared machine):")  # fmt: skip
    for c in cases:
        med = statistics.median(times[c])
        label = "base model" if c == 0 else f"{c} adapter{'s' * (c > 1)}"
        print(f"  {label:12s} {med * 1e3:8.2f} ms   {med / base:5.2f}x base")


if __name__ == "__main__":
    main()
