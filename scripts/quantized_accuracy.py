"""What each pre-quantised HF format costs on a real model: the embedded Gemma 3 270M quantised
into AWQ, GPTQ and compressed-tensors INT8 / FP8 folders, each measured with inferd against the
unquantised model on fixed text. A measurement, not a test (docs/quantization.md has the table).

"The unquantised model" is the embedded GGUF file's weights dequantised to float32 by HF
transformers (its Q4_K / Q5_0 / Q6_K / Q8_0 values as floats), saved once as an HF folder and run
by inferd with `--dtype float32`. Each format's folder is that model's linear layers quantised by
round-to-nearest with the packers the parity tests use (tests/quantized_checkpoints.py) and run
in inferd's default mode (`LLM(model=folder)`: the checkpoint's format, its C kernels).
Teacher-forced next-token logits over the first 256 tokens of docs/engine.md give each format's
top-1 agreement with the reference and its perplexity ratio (format / reference); HF
transformers on the same dequantised weights says how much of a loss is the quantiser's.

    python scripts/quantized_accuracy.py [--json rows.json] [--work DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "parity")]
from quantized_checkpoints import (  # noqa: E402  (the tests' packers)
    LINEARS,
    awq_config,
    awq_layer,
    compressed_config,
    fp8_layer,
    gptq_layer,
    int8_layer,
    write_quantized,
)
from test_quantization_accuracy import N_TOKENS, TEXT, all_logits, perplexity  # noqa: E402

from inferd import LLM  # noqa: E402
from inferd.layers.block_method import BlockMethod  # noqa: E402
from inferd.layers.fp8_checkpoint_method import (  # noqa: E402
    FP8_MAX,
    Fp8CheckpointMethod,
    fp8_rounded,
)

GROUP = 128
Quantize = Callable[[str, torch.Tensor], tuple[dict, torch.Tensor]]


def _input_seed(key: str) -> int:
    """One act-order permutation per layer input: q, k and v read the same activations, as do
    gate and up, so a GPTQ tool sorts their inputs alike (inferd fuses them into one layer)."""
    for proj, shared in (("k_proj", "q_proj"), ("v_proj", "q_proj"), ("up_proj", "gate_proj")):
        key = key.replace(proj, shared)
    return zlib.crc32(key.encode())


def _gptq(bits: int, sym: bool, act_order: bool):
    config = {"quant_method": "gptq", "bits": bits, "group_size": GROUP, "sym": sym,
              "desc_act": act_order}  # fmt: skip
    return (lambda key, w: gptq_layer(w, bits, GROUP, sym, act_order, _input_seed(key))), config


def _int8(w8a8: bool):
    weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
    acts = {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True} if w8a8 else None
    return (lambda key, w: int8_layer(w, None)), compressed_config(weights, acts, "int-quantized")


def _fp8(per_channel: bool, input_scale: dict[str, float] | None):
    """FP8 e4m3; with `input_scale`, each layer's static activation scale (from calibration)."""
    weights = {"num_bits": 8, "type": "float", "symmetric": True,
               "strategy": "channel" if per_channel else "tensor"}  # fmt: skip
    acts = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False} \
        if input_scale else None  # fmt: skip

    def quantize(key: str, w: torch.Tensor):
        return fp8_layer(w, per_channel, input_scale[key] if input_scale else None)

    return quantize, compressed_config(weights, acts, "float-quantized")


def _awq(scales):
    return (lambda key, w: awq_layer(w, GROUP)), awq_config(GROUP)


# name -> (what it is, builder(static input scale per layer) -> (quantize, quantization_config))
FORMATS: dict[str, tuple[str, Callable[[dict], tuple[Quantize, dict]]]] = {
    "awq-4bit-g128": ("AWQ 4-bit, g128, zero points", _awq),
    "gptq-4bit-g128-sym": ("GPTQ 4-bit, g128, symmetric", lambda s: _gptq(4, True, False)),
    "gptq-4bit-g128-act-order": ("GPTQ 4-bit, g128, act-order, asymmetric",
                                 lambda s: _gptq(4, False, True)),
    "gptq-8bit-g128-sym": ("GPTQ 8-bit, g128, symmetric", lambda s: _gptq(8, True, False)),
    "int8-w8a16": ("INT8 per channel (W8A16)", lambda s: _int8(False)),
    "int8-w8a8": ("INT8 per channel, W8A8 (int8 per-token dynamic activations declared)",
                  lambda s: _int8(True)),
    "fp8-channel": ("FP8 per channel (W8A16)", lambda s: _fp8(True, None)),
    "fp8-tensor-static": ("FP8 per tensor, static FP8 input scale", lambda s: _fp8(False, s)),
}  # fmt: skip
STATIC_FP8 = {"fp8-tensor-static"}  # activations rounded to e4m3 at each layer's static scale


def reference_folder(work: Path) -> Path:
    """The embedded GGUF model dequantised to float32 by HF transformers, as an HF folder with
    inferd's exported tokenizer (written once; 1-2 minutes)."""
    from transformers import AutoModelForCausalLM

    from inferd.loader.default_model import default_model_path

    folder = work / "reference-f32"
    if (folder / "done").exists():
        return folder
    gguf = default_model_path()
    print(f"converting {gguf.name} to a float32 HF folder (once) ...", flush=True)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)  # fmt: skip
    # NOTE: the weights are plain float32 tensors once dequantised; transformers only marks the
    # model as loaded from GGUF, which save_pretrained refuses.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder, safe_serialization=True)
    subprocess.run([sys.executable, "-m", "inferd", "export-tokenizer", "-q", str(gguf),
                    str(folder)], check=True)  # fmt: skip
    (folder / "done").write_text(gguf.name + "\n")
    return folder


def load_hf(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _decoder_linears(model):
    """(key as write_quantized names it, module) of each decoder linear layer of an HF model."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in LINEARS and "model.layers." in name:
            yield name[name.index("model.layers.") :], module


def hf_logits(model, ids: list[int], input_scale: dict[str, float] | None = None):
    """HF transformers' logits over `ids` and each decoder linear layer's input absolute max;
    with `input_scale`, each layer's input rounded to e4m3 at its scale first (what a static
    FP8 checkpoint computes)."""
    amax: dict[str, float] = {}
    hooks = []
    for key, module in _decoder_linears(model):

        def hook(m, args, key=key):
            amax[key] = max(amax.get(key, 0.0), args[0].abs().max().item())
            if input_scale:
                return (fp8_rounded(args[0], input_scale[key]),)

        hooks.append(module.register_forward_pre_hook(hook))
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    for h in hooks:
        h.remove()
    return logits, amax


def held_bytes(model) -> tuple[int, int]:
    """(all weights, the quantised linear layers) as inferd holds them: parameters, buffers,
    the repacked blocks and the FP8 bytes."""
    linear = 0
    for module in model.modules():
        if isinstance(module, BlockMethod) and module.blocks is not None:
            linear += module.blocks.nbytes
        elif isinstance(module, Fp8CheckpointMethod) and module.fp8 is not None:
            linear += module.fp8.nbytes
    dense = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    return dense + linear, linear


def measure(folder: Path, ids: list[int] | None, dtype: str) -> dict:
    """inferd's teacher-forced logits over `ids` (None: the text's first tokens, encoded by the
    folder's tokenizer) in `dtype`, and what the model holds."""
    start = time.perf_counter()
    llm = LLM(model=str(folder), dtype=dtype, kv_cache_memory=64 << 20,
              max_num_batched_tokens=512)  # fmt: skip
    try:
        model = llm.engine.runner.model
        ids = ids or llm.get_tokenizer().encode(TEXT)[:N_TOKENS]
        logits = all_logits(llm, ids)
        total, linear = held_bytes(model)
        scheme = model.scheme
    finally:
        llm.shutdown()
    fmt = scheme.stored
    return {
        "scheme": scheme.describe(),
        "ids": ids,
        "logits": logits,
        "file_bits": fmt.file_bits_per_weight() if fmt else None,
        "held_bits": fmt.held_bits_per_weight() if fmt else None,
        "held_mib": total / 2**20,
        "linear_mib": linear / 2**20,
        "seconds": time.perf_counter() - start,
    }


def cpu() -> str:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines()
                 if ln.startswith("model name")), "unknown CPU")  # fmt: skip
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines()
                  if ln.startswith("flags")), [])  # fmt: skip
    avx = sorted({f for f in flags if f.startswith("avx")})
    return f"{name}, {os.cpu_count()} cores ({' '.join(avx) or 'no AVX'})"


def agreement(logits: torch.Tensor, reference: torch.Tensor) -> float:
    return (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/inferd-quantized-accuracy"))
    parser.add_argument("--formats", nargs="*", choices=list(FORMATS), default=list(FORMATS))
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--keep", action="store_true", help="keep the quantised folders")
    args = parser.parse_args()
    start = time.perf_counter()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args.work.mkdir(parents=True, exist_ok=True)

    ref_folder = reference_folder(args.work)
    ref_model = load_hf(ref_folder)
    for key, module in _decoder_linears(ref_model):  # AWQ/GPTQ groups must be whole
        if module.in_features % GROUP:
            raise SystemExit(f"{key}: {module.in_features} inputs are not groups of {GROUP}")
    ref = measure(ref_folder, None, "float32")
    ids = ref["ids"]
    ref_ppl = perplexity(ref["logits"], ids)
    hf_ref, amax = hf_logits(ref_model, ids)
    # a calibration's static scale: the layer's activation absolute max over the text at 448
    scales = {key: value / FP8_MAX for key, value in amax.items()}
    # write_quantized loads each format's dequantised weights into the model: kept to restore
    originals = {key: m.weight.detach().clone() for key, m in _decoder_linears(ref_model)}
    linear_f32 = sum(w.numel() * w.element_size() for w in originals.values())
    print(f"reference: {ref['scheme']}; perplexity {ref_ppl:.3f} over {len(ids)} tokens; "
          f"top-1 agreement with HF transformers {agreement(ref['logits'], hf_ref):.3f}",
          flush=True)  # fmt: skip

    rows = [{"format": "unquantised (the GGUF's weights as float32), --dtype float32",
             "name": "reference", "agreement": 1.0, "perplexity": ref_ppl, "ppl_ratio": 1.0,
             "hf_agreement": agreement(ref["logits"], hf_ref), "file_bits": 32.0,
             "held_bits": 32.0, "held_mib": ref["held_mib"], "linear_mib": linear_f32 / 2**20,
             "scheme": ref["scheme"]}]  # fmt: skip
    for name in args.formats:
        label, build = FORMATS[name]
        folder = args.work / name
        quantize, config = build(scales)
        write_quantized(ref_model, folder, quantize, config)  # loads the dequantised weights
        for f in ref_folder.iterdir():  # the tokenizer's files
            if not (folder / f.name).exists() and f.name != "done":
                (folder / f.name).write_bytes(f.read_bytes())
        # HF on the same dequantised weights: how faithfully inferd runs the format
        hf_same = hf_logits(ref_model, ids, scales if name in STATIC_FP8 else None)[0]
        with torch.no_grad():
            for key, module in _decoder_linears(ref_model):
                module.weight.copy_(originals[key])
        try:
            got = measure(folder, ids, "auto")
        except Exception as e:  # noqa: BLE001 (a format inferd cannot run yet is reported)
            print(f"{name}: inferd failed: {type(e).__name__}: {e}", flush=True)
            rows.append({"format": label, "name": name, "error": f"{type(e).__name__}: {e}"})
            continue
        finally:
            if not args.keep:
                shutil.rmtree(folder)
        ppl = perplexity(got["logits"], ids)
        row = {"format": label, "name": name, "agreement": agreement(got["logits"], ref["logits"]),
               "perplexity": ppl, "ppl_ratio": ppl / ref_ppl,
               "hf_agreement": agreement(got["logits"], hf_same),
               "hf_agreement_with_reference": agreement(hf_same, hf_ref),
               "hf_ppl_ratio": perplexity(hf_same, ids) / perplexity(hf_ref, ids),
               **{k: got[k] for k in ("file_bits", "held_bits", "held_mib", "linear_mib",
                                      "scheme")}}  # fmt: skip
        rows.append(row)
        print(f"{name}: agreement {row['agreement']:.3f}, perplexity ratio "
              f"{row['ppl_ratio']:.3f} (HF on the same weights: {row['hf_ppl_ratio']:.3f}; "
              f"top-1 vs HF {row['hf_agreement']:.3f}, HF's own agreement "
              f"{row['hf_agreement_with_reference']:.3f}); {got['seconds']:.0f} s",
              flush=True)  # fmt: skip
    print_table(rows, ids)
    cpu_s = sum(os.times()[:4])
    print(f"\n{time.perf_counter() - start:.0f} s wall, {cpu_s:.0f} s CPU")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu(), "tokens": len(ids), "rows": rows},
                                        indent=1) + "\n")  # fmt: skip


def print_table(rows: list[dict], ids: list[int]) -> None:
    print(f"\n{cpu()}; {len(ids)} tokens of docs/engine.md, teacher-forced")
    print("| format | top-1 agreement | perplexity ratio (HF on the same weights) "
          "| top-1 vs HF on the same weights | bits/weight in file | bits/weight held "
          "| weights held, MiB: all / linear layers |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['format']} | failed: {r['error']} | | | | | |")
            continue
        hf = f" ({r['hf_ppl_ratio']:.3f})" if "hf_ppl_ratio" in r else ""
        print(f"| {r['format']} | {r['agreement']:.3f} | {r['ppl_ratio']:.3f}{hf} "
              f"| {r['hf_agreement']:.3f} | {r['file_bits']:.2f} | {r['held_bits']:.2f} "
              f"| {r['held_mib']:.0f} / {r['linear_mib']:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
