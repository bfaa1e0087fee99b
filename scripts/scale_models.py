"""GGUF files with random weights at the shapes of the models users run, for benchmarks only.

Writes an F16 GGUF file of a real model's shape (random weights, a vocabulary of plain pieces)
tensor by tensor, so that even the 8B one (16 GB) never sits in memory, then quantises it with
llama.cpp's own `llama-quantize` to each type asked for: the files a user downloads, with the
layouts llama.cpp's converter and quantiser give them (which tensors get which type in Q4_K_M).
Never used by the test suite. Speed and memory do not depend on the weights' values; the text
such a model writes is noise.

    python scripts/scale_models.py --quantize /path/to/llama-quantize --out /data/models \\
        --shape qwen2.5-1.5b --types Q4_K_M Q8_0 IQ4_XS

llama-quantize comes from the llama-cpp-python 0.3.36 sdist's vendored source
(docs/benchmarks.md has the commands). Files already present are kept.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Shape:
    arch: str  # GGUF general.architecture
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    inter: int
    vocab: int
    tied: bool
    qkv_bias: bool
    rope_base: float
    eps: float

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# The published configs' shapes (config.json of each model).
SHAPES = {
    "qwen2.5-1.5b": Shape("qwen2", 1536, 28, 12, 2, 8960, 151936, True, True, 1e6, 1e-6),
    "qwen2.5-3b": Shape("qwen2", 2048, 36, 16, 2, 11008, 151936, True, True, 1e6, 1e-6),
    "llama-3.1-8b": Shape("llama", 4096, 32, 32, 8, 14336, 128256, False, False, 5e5, 1e-5),
}


def tensors(s: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, shape outermost first) of every tensor, in llama.cpp's converter's order."""
    out = [("token_embd.weight", (s.vocab, s.hidden))]
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    for i in range(s.layers):
        p = f"blk.{i}"
        out += [
            (f"{p}.attn_norm.weight", (s.hidden,)),
            (f"{p}.attn_q.weight", (q, s.hidden)),
            (f"{p}.attn_k.weight", (kv, s.hidden)),
            (f"{p}.attn_v.weight", (kv, s.hidden)),
        ]
        if s.qkv_bias:
            out += [
                (f"{p}.attn_q.bias", (q,)),
                (f"{p}.attn_k.bias", (kv,)),
                (f"{p}.attn_v.bias", (kv,)),
            ]
        out += [
            (f"{p}.attn_output.weight", (s.hidden, q)),
            (f"{p}.ffn_norm.weight", (s.hidden,)),
            (f"{p}.ffn_gate.weight", (s.inter, s.hidden)),
            (f"{p}.ffn_up.weight", (s.inter, s.hidden)),
            (f"{p}.ffn_down.weight", (s.hidden, s.inter)),
        ]
    out.append(("output_norm.weight", (s.hidden,)))
    if not s.tied:
        out.append(("output.weight", (s.vocab, s.hidden)))
    return out


def write_f16(path: Path, name: str, s: Shape, seed: int = 0) -> None:
    """The F16 file, one tensor in memory at a time (norm gains 1, biases 0, matrices N(0, 0.02)
    so that activations stay finite through every layer)."""
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), s.arch)
    writer.add_name(f"{name} (random weights)")
    writer.add_block_count(s.layers)
    writer.add_context_length(32768)
    writer.add_embedding_length(s.hidden)
    writer.add_feed_forward_length(s.inter)
    writer.add_head_count(s.heads)
    writer.add_head_count_kv(s.kv_heads)
    writer.add_rope_dimension_count(s.head_dim)
    writer.add_rope_freq_base(s.rope_base)
    writer.add_layer_norm_rms_eps(s.eps)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    pieces = ["<unk>", "<s>", "</s>"] + [f"\u2581t{i}" for i in range(3, s.vocab)]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores([0.0] * 3 + [-float(i) for i in range(3, s.vocab)])
    writer.add_token_types([2, 3, 3] + [1] * (s.vocab - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    plan = tensors(s)
    for tname, shape in plan:
        dtype = np.float16 if len(shape) == 2 else np.float32
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        writer.add_tensor_info(tname, shape, np.dtype(dtype), nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tname, shape in plan:
        if len(shape) == 1:
            value = 0.0 if tname.endswith(".bias") else 1.0
            data = np.full(shape, value, dtype=np.float32)
        else:
            data = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
        writer.write_tensor_data(data)
    writer.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the files")
    ap.add_argument("--shape", choices=sorted(SHAPES), action="append", required=True)
    ap.add_argument(
        "--types",
        nargs="+",
        default=["Q4_K_M"],
        help="llama-quantize type names (Q4_K_M, Q8_0, IQ4_XS, ...)",
    )
    ap.add_argument("--quantize", type=Path, help="the llama-quantize binary")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep-f16", action="store_true", help="keep the F16 source file")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.shape:
        shape = SHAPES[name]
        source = args.out / f"{name}-F16.gguf"
        targets = [args.out / f"{name}-{t}.gguf" for t in args.types]
        if all(t.exists() for t in targets):
            continue
        if not source.exists():
            print(f"writing {source}", flush=True)
            write_f16(source, name, shape)
        for kind, target in zip(args.types, targets):
            if target.exists() or kind == "F16":
                continue
            if args.quantize is None:
                sys.exit("--quantize (the llama-quantize binary) is needed for " + kind)
            print(f"quantising {target}", flush=True)
            subprocess.run(
                [str(args.quantize), str(source), str(target), kind, str(args.threads)],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        if not args.keep_f16 and "F16" not in args.types:
            source.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
