"""What each KV cache dtype costs in accuracy: a model's teacher-forced next-token predictions over
a fixed text with its KV cache in float32 (the reference), bfloat16, float16, fp8 and int8, the
weights and everything else the same (the default mode: `LLM(model, kv_cache_dtype=...)`).
A measurement, not a test (docs/memory.md has the table).

Per KV dtype: top-1 agreement (the share of positions whose greedy next token equals the float32
KV's), the perplexity ratio (its perplexity over the float32 KV's, on the text's own next tokens),
the bytes a token's KV takes and how many 4096-token contexts fit in 1 GiB of KV
(inferd/memory/kv_dtypes.py). The text is computed in steps of `--chunk` tokens (prefill steps,
which store each step's keys and values and read them back from the cache as decode does); in
the default mode on GGUF blocks a position's logits are the same for any chunking. A dtype the
engine refuses here (float16 KV on a CPU) is reported with the reason.

    python scripts/kv_dtype_accuracy.py [--model gemma-3-270m] [--tokens 1536] [--chunk 256]
        [--text /usr/share/common-licenses/GPL-3] [--json rows.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from inferd import LLM
from inferd.attention.cpu_backend import C_CACHE_DTYPES
from inferd.cpu_info import cpu_flags
from inferd.engine.execution.runner import SequenceStep
from inferd.memory.kv_dtypes import kv_dtype_capacities

KV_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "fp8": "fp8",
             "int8": "int8"}  # fmt: skip
DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")  # fixed prose on every Debian system


def predictions(llm: LLM, ids: list[int], chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(greedy next token, log-probability of the text's next token) at positions 0 .. n-2,
    teacher-forced `chunk` tokens per step; logits are dropped chunk by chunk (a 262k vocabulary
    is 1 MiB a position)."""
    runner = llm.engine.runner
    tables = [list(range(1, 2 + len(ids) // runner.block_size))] * len(runner.kv_caches)
    runner.clear_blocks(tables)
    top, target = [], []
    for start in range(0, len(ids), chunk):
        step = SequenceStep(ids[start : start + chunk], start, tables, all_logits=True)
        with torch.inference_mode():
            logits = runner.execute_with_prompt_logits([step])[1][0].float()
        logp = torch.log_softmax(logits, dim=-1)
        nxt = torch.tensor(ids[start + 1 : start + chunk + 1])
        top.append(logits.argmax(-1)[: len(nxt)])
        target.append(logp[: len(nxt)].gather(1, nxt[:, None])[:, 0])
    return torch.cat(top), torch.cat(target)


def attention_path(runner) -> str:
    """Which code attends: the C decoder layer (fixed order, float32 products over the cache's
    values), or the model's PyTorch layers with the backend's attention."""
    cache = runner.kv_caches[0][0].dtype
    if (runner.model.cpu_decoder is not None and getattr(runner.backend, "fixed_order", False)
            and cache in C_CACHE_DTYPES):  # fmt: skip
        return "C decoder layer"
    return f"PyTorch layers, {runner.backend.name} attention"


def measure(model: str | None, text: str, tokens: int, chunk: int) -> dict:
    rows, reference = [], None
    capacity = {}
    for flag, name in KV_DTYPES.items():
        t0 = time.perf_counter()
        try:
            llm = LLM(model=model, kv_cache_dtype=flag, kv_cache_memory=512 << 20,
                      max_num_batched_tokens=chunk)  # fmt: skip
        except ValueError as e:
            rows.append({"kv_dtype": flag, "refused": str(e)})
            continue
        if not capacity:
            config = llm.engine.model_config
            capacity = {r.kv_dtype: r for r in kv_dtype_capacities(config, device="cpu")}
            ids = llm.get_tokenizer().encode(text)[:tokens]
            if len(ids) < tokens:
                raise SystemExit(f"the text has only {len(ids)} tokens; --tokens {tokens} asked")
        top, target = predictions(llm, ids, chunk)
        ppl = torch.exp(-target.mean()).item()
        if reference is None:
            reference = (top, ppl)
        runner = llm.engine.runner
        rows.append({
            "kv_dtype": flag,
            "agreement": (top == reference[0]).float().mean().item(),
            "perplexity": ppl,
            "perplexity_ratio": ppl / reference[1],
            "bytes_per_token": capacity[name].bytes_per_token,
            "contexts_4k_per_gib": capacity[name].contexts_4k_per_gib,
            "path": attention_path(runner),
            "seconds": time.perf_counter() - t0,
        })  # fmt: skip
        del llm
    name = model or "the embedded model (gemma-3-270m)"
    return {"model": name, "tokens": tokens, "chunk": chunk, "rows": rows}


def print_table(result: dict) -> None:
    print(f"\n{result['model']}: {result['tokens']} tokens, {result['chunk']} per step")
    print(
        "| KV dtype | top-1 agreement | perplexity ratio | bytes/token | 4k contexts per GiB "
        "| attention path |"
    )
    print("|---|---|---|---|---|---|")
    for r in result["rows"]:
        if "refused" in r:
            print(f"| {r['kv_dtype']} | refused: {r['refused']} | | | | |")
            continue
        print(
            f"| {r['kv_dtype']} | {r['agreement']:.4f} | {r['perplexity_ratio']:.4f} | "
            f"{r['bytes_per_token']:,} | {r['contexts_4k_per_gib']:,} | {r['path']} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", default=None,
                        help="a model name, GGUF file or HF folder (repeatable; default: the "
                             "embedded model)")  # fmt: skip
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="the fixed text")
    parser.add_argument("--tokens", type=int, default=1536, help="tokens of the text")
    parser.add_argument("--chunk", type=int, default=256, help="tokens per step")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    text = args.text.read_text()
    flags = sorted(f for f in cpu_flags() if f in ("avx2", "fma", "f16c") or
                   f.startswith("avx512"))  # fmt: skip
    print(
        f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} "
        f"threads, {' '.join(flags)}; torch {torch.__version__}; text {args.text}"
    )
    results = [measure(m, text, args.tokens, args.chunk) for m in (args.model or [None])]
    for result in results:
        print_table(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
