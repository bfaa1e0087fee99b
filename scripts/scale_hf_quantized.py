"""Pre-quantised HF folders (AWQ, GPTQ, compressed-tensors INT8 / FP8) of the same weights as an
F16 GGUF file written by scale_models.py, for benchmarks only: the AWQ folder against the
GGUF Q4_K_M file and the FP8 one against Q8_0, on the same random weights at a real shape.

Each linear layer is quantised by round-to-nearest (tests/quantized_checkpoints.py, the packers
the parity tests use); embeddings and norms stay fp16, as the tools leave them. The tokenizer is
the GGUF file's, exported with `inferd export-tokenizer`. Written a layer at a time into
safetensors shards, so a 1.5B model never sits in memory as float32.

    python scripts/scale_hf_quantized.py /data/models/qwen2.5-1.5b-F16.gguf --out /data/models \\
        --formats awq fp8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from quantized_checkpoints import (  # noqa: E402  (the tests' packers)
    LINEARS,
    awq_config,
    awq_layer,
    compressed_config,
    fp8_layer,
    gptq_layer,
    int8_layer,
)

from inferd.loader import open_checkpoint  # noqa: E402

FORMATS = {
    "awq": (lambda w: awq_layer(w, 128)[0], awq_config(128)),
    "gptq": (
        lambda w: gptq_layer(w, 4, 128, True, False, 0)[0],
        {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False},
    ),  # fmt: skip
    "int8": (
        lambda w: int8_layer(w, None)[0],
        compressed_config(
            {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True},
            None,
            "int-quantized",
        ),
    ),  # fmt: skip
    "fp8": (
        lambda w: fp8_layer(w, True, None)[0],
        compressed_config(
            {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
            None,
            "float-quantized",
        ),
    ),  # fmt: skip
}
SHARD_BYTES = 2 << 30


def _config(cfg, quantization_config: dict) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope.theta, "tie_word_embeddings": cfg.tie_word_embeddings,
        "torch_dtype": "float16", "hidden_act": "silu",
        "quantization_config": quantization_config,
    }  # fmt: skip


def write(gguf: Path, out: Path, fmt: str) -> Path:
    quantize, qc = FORMATS[fmt]
    folder = out / f"{gguf.stem.removesuffix('-F16')}-{fmt}"
    if (folder / "model.safetensors.index.json").exists():
        print(f"{folder}: already written")
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    ckpt = open_checkpoint(gguf)
    shard: dict[str, torch.Tensor] = {}
    weight_map: dict[str, str] = {}
    size = files = 0

    def flush():
        nonlocal shard, size, files
        files += 1
        name = f"model-{files:05d}.safetensors"
        save_file(shard, str(folder / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
        shard, size = {}, 0

    for name, weight in ckpt.weights():
        t = weight.load(torch.float32)
        prefix, _, leaf = name.rpartition(".")
        if leaf == "weight" and prefix.rpartition(".")[2] in LINEARS:
            tensors = {f"{prefix}.{k}": v.contiguous() for k, v in quantize(t).items()}
        else:
            tensors = {name: t.half()}
        for k, v in tensors.items():
            shard[k] = v
            size += v.numel() * v.element_size()
        if size > SHARD_BYTES:
            flush()
    if shard:
        flush()
    (folder / "config.json").write_text(json.dumps(_config(ckpt.config, qc), indent=1))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    subprocess.run([sys.executable, "-m", "inferd", "export-tokenizer", "-q", str(gguf),
                    str(folder)], check=True)  # fmt: skip
    print(f"{folder}: written")
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf", type=Path, help="an F16 GGUF file (scripts/scale_models.py)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--formats", nargs="+", choices=sorted(FORMATS), default=["awq", "fp8"])
    args = parser.parse_args(argv)
    for fmt in args.formats:
        write(args.gguf, args.out, fmt)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
