"""A stand-in for the embedded model on a GPU machine that cannot install it (no registry, and
its 253 MB GGUF is more than a device call carries): an HF folder with the embedded model's
own configuration and tokenizer, and random bf16 weights. Every shape is the embedded model's,
so a step reads the same bytes and does the same arithmetic; its text is noise, which a speed
figure with EOS ignored does not see. Parity checks compare two paths on the same weights.

    python scripts/gpu_standin.py prepare DIR   # where the embedded model is: config, tokenizer
    python scripts/gpu_standin.py weights DIR   # on the GPU machine: seeded random weights
    INFERD_GPU_MODEL=DIR bash scripts/gpu_check.sh
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path


def prepare(folder: Path) -> None:
    import transformers
    from transformers import AutoConfig

    from inferd.loader import open_checkpoint

    gguf = Path(open_checkpoint(None).path)
    transformers.logging.set_verbosity_error()
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    subprocess.run([sys.executable, "-m", "inferd", "export-tokenizer", "--quiet", str(gguf),
                    str(folder)], check=True)  # fmt: skip


def weights(folder: Path, seed: int) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    t0 = time.perf_counter()
    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(folder)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):  # the initialisation of 268 M values: seconds on CPU
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    n = sum(p.numel() for p in model.parameters())
    print(f"{folder}: {n / 1e6:.0f} M random bf16 parameters (seed {seed}) written in "
          f"{time.perf_counter() - t0:.1f} s")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=["prepare", "weights"])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    prepare(args.folder) if args.step == "prepare" else weights(args.folder, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
