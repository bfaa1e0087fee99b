r"""CPU time of the block product (inferd_block_gemv) on the embedded model's matrices, against
PyTorch's `F.linear` on bfloat16 and float32 copies, at several row counts; one thread.

    python scripts/bench_block_kernels.py                       # this tree's kernels
    python scripts/bench_block_kernels.py --json out.json       # keep the medians
    python scripts/bench_block_kernels.py --against base.json   # ratios to an earlier run

CPU time of the calling thread (one OpenMP and one PyTorch thread), so another process on the
machine costs less than it would in wall-clock time; still, quote only ratios from one run
(products bound by memory bandwidth, the LM head's at few rows, feel other processes anyway).

Called again and again, a matrix stays in the CPU's caches, where a decode step reads every
weight from memory (a model is larger than the caches): `--cold MIB` reads a buffer of that
many MiB (more than the last-level cache) before each timed call, so the call reads its
weights from memory, as in a decode step.

`--earlier PACKAGE` also times an earlier tree's block kernels in the same process, interleaved
with this tree's: a copy of that tree's `inferd` renamed so both import, e.g.

    git archive <commit> inferd | tar -x -C /tmp/e && mv /tmp/e/inferd /tmp/e/inferd_old
    grep -rl inferd /tmp/e/inferd_old | xargs sed -i -E 's/\binferd\./inferd_old./g'
    PYTHONPATH=/tmp/e python scripts/bench_block_kernels.py --earlier inferd_old
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from inferd.layers.gguf_blocks import BlockWeight  # noqa: E402
from inferd.loader import gguf_quants as gq  # noqa: E402
from inferd.loader.gguf_file import GGUFFile  # noqa: E402

ROWS = (1, 2, 4, 8, 16, 64, 256, 512)
HEAD_ROWS = (1, 2, 4, 8, 16, 32, 64)  # the LM head only ever sees a step's last positions


def model_path() -> str:
    from inferd.loader.default_model import default_model_path

    return str(default_model_path())


def matrices(layer: int, package: str = "inferd") -> dict[str, BlockWeight]:
    """The matrices of one layer and the LM head, as `package`'s block weights."""
    module = importlib.import_module(f"{package}.layers.gguf_blocks")
    block_weight, stack = module.BlockWeight, module.stack
    f = GGUFFile(model_path())

    def blocks(name: str) -> BlockWeight:
        info = f.tensors[name]
        return block_weight(*gq.unpack(f.raw(name), info.ggml_type, info.shape))

    b = f"blk.{layer}."
    return {
        "qkv 640->1536": stack(
            [blocks(b + n) for n in ("attn_q.weight", "attn_k.weight", "attn_v.weight")]
        ),  # fmt: skip
        "o 1024->640": blocks(b + "attn_output.weight"),
        "gate_up 640->4096": stack([blocks(b + "ffn_gate.weight"), blocks(b + "ffn_up.weight")]),
        "down 2048->640": blocks(b + "ffn_down.weight"),
        "head 640->262144": blocks("token_embd.weight"),
    }


def cpu_seconds(fn, budget: float, evict=None) -> float:
    """Median CPU time of `fn` over at least 3 runs and about `budget` seconds (`evict`: called
    before each run, untimed)."""
    fn()  # warm: first-touch pages, caches
    times: list[float] = []
    while len(times) < 3 or (sum(times) < budget and len(times) < 50):
        if evict is not None:
            evict()
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="blocks,bf16,fp32")
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--budget", type=float, default=0.3, help="CPU seconds per figure")
    parser.add_argument("--only", default="", help="matrices whose name contains this")
    parser.add_argument("--json", help="write the medians (ms) here")
    parser.add_argument("--against", help="an earlier run's --json: print ratios to its blocks")
    parser.add_argument("--earlier", help="an earlier tree's inferd, renamed (see above)")
    parser.add_argument("--cold", type=int, default=0, help="MiB read before each call")
    args = parser.parse_args()
    torch.set_num_threads(1)
    evict = None
    if args.cold:  # every line of the buffer read and written: through every cache level
        evict = functools.partial(torch.ones(args.cold << 18).add_, 1.0)  # float32: 2^18 a MiB
    methods = args.methods.split(",") + (["earlier"] if args.earlier else [])
    found: dict[str, float] = {}
    base = json.load(open(args.against)) if args.against else {}
    earlier = matrices(args.layer, args.earlier) if args.earlier else {}
    for name, w in matrices(args.layer).items():
        if args.only not in name:
            continue
        dense = {"bf16": w.dense(torch.bfloat16) if "bf16" in methods else None,
                 "fp32": w.dense(torch.float32) if "fp32" in methods else None}  # fmt: skip
        layouts = ", ".join(p.summary() for p in w.parts)
        print(f"{name} ({layouts}); ms per call, one thread, CPU time")
        for m in HEAD_ROWS if name.startswith("head") else ROWS:
            x = torch.randn(m, w.shape[1])
            runs = {"blocks": functools.partial(w, x),
                    "earlier": functools.partial(earlier.get(name, w), x),
                    "bf16": functools.partial(F.linear, x.bfloat16(), dense["bf16"]),
                    "fp32": functools.partial(F.linear, x, dense["fp32"])}  # fmt: skip
            line = [f"  M={m:<4}"]
            for method in methods:
                ms = 1e3 * cpu_seconds(runs[method], args.budget, evict)
                found[f"{name}|{m}|{method}"] = ms
                line.append(f"{method} {ms:9.3f}")
            if "blocks" in methods:
                blocks = found[f"{name}|{m}|blocks"]
                for method in ("bf16", "fp32", "earlier"):
                    if method in methods:
                        ratio = found[f"{name}|{m}|{method}"] / blocks
                        line.append(f"{method}/blocks {ratio:5.2f}")
                before = base.get(f"{name}|{m}|blocks")
                if before:
                    line.append(f"--against/blocks {before / blocks:5.2f}")
            print("  ".join(line), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(found, f, indent=1)


if __name__ == "__main__":
    main()
