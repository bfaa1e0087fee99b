r"""Wall-clock time of the FP8 product (inferd_fp8_gemm, inferd/layers/fp8_weight.py) against the
Q8_0 block product (inferd_block_gemv: 8-bit q, a scale per 32) on the same shape, both with all
of this process's threads; prints medians and the ratio FP8 / Q8_0.

    python scripts/bench_fp8_kernel.py                    # 1536 x 8960, M = 1 and 512
    python scripts/bench_fp8_kernel.py --rows 1 8 16 512 --out 8960 --in 1536

The weights are random (the time does not depend on their values). A 1536 x 8960 matrix of one
byte per weight (13 MiB) fits in a large last-level cache, where a decode step reads its weights
from memory (a model is larger than the caches): for steps of fewer than `--cold-below` rows each
timed call is preceded by a read of `--cold MIB` of other memory, so that call reads its weights
from memory too; both are printed (`cold`, `warm`). Other processes on the machine move these
figures, most of all the memory-bound ones: quote ratios from one run.

How the codes become floats (shifts and vcvtph2ps against a float table read by vgatherdps) was
measured apart, in a loop of its own: cpu_kernels/fp8_convert.h's opening comment has the figures.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from inferd.layers.fp8_weight import Fp8Weight
from inferd.layers.gguf_blocks import BlockWeight


def timed(fn, x: torch.Tensor, repeats: int, flush: torch.Tensor | None) -> float:
    """Median milliseconds of fn(x) over `repeats` calls (after one untimed call)."""
    fn(x)
    times = []
    for _ in range(repeats):
        if flush is not None:
            flush.sum()  # evicts the weights from the caches
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=int, default=1536, help="output rows N")
    parser.add_argument("--in", dest="inputs", type=int, default=8960, help="inputs K")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 512], help="M per call")
    parser.add_argument("--repeats", type=int, default=0, help="0: by the size of the call")
    parser.add_argument("--cold", type=int, default=128, help="MiB read before a cold call")
    parser.add_argument("--cold-below", type=int, default=16, help="rows below which to time cold")
    parser.add_argument("--threads", type=int, default=0, help="0: PyTorch's default")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)  # the kernels' OpenMP threads too

    n, k = args.out, args.inputs
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (n, k), dtype=torch.uint8, generator=gen)
    codes[(codes & 0x7F) == 0x7F] = 0x38  # no NaN codes (1.0 instead)
    scale = torch.rand(n, generator=gen) * 0.01 + 1e-3
    t0 = time.perf_counter()
    fp8 = Fp8Weight(codes, scale)
    pack_ms = (time.perf_counter() - t0) * 1e3
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    q8 = BlockWeight(q, (torch.rand(n, k // 32, generator=gen) * 0.01).half().float())
    flush = torch.ones(args.cold << 18) if args.cold else None

    print(f"{n} x {k}, {torch.get_num_threads()} threads; FP8 {fp8.nbytes / 2**20:.1f} MiB "
          f"(packed in {pack_ms:.0f} ms), Q8_0 {q8.nbytes / 2**20:.1f} MiB")  # fmt: skip
    print(f"{'M':>5} {'':>5} {'fp8 ms':>9} {'q8_0 ms':>9} {'fp8/q8_0':>9} {'fp8 GB/s':>9} "
          f"{'fp8 GFLOP/s':>12}")  # fmt: skip
    for m in args.rows:
        x = torch.randn(m, k, generator=gen)
        repeats = args.repeats or max(5, min(50, int(2e9 // (m * n * k))))
        kinds = ("cold", "warm") if m < args.cold_below and flush is not None else ("warm",)
        for kind in kinds:
            f = flush if kind == "cold" else None
            a, b = timed(fp8, x, repeats, f), timed(q8, x, repeats, f)
            rate, flops = fp8.codes.numel() / a / 1e6, 2 * m * n * k / a / 1e6
            print(f"{m:>5} {kind:>5} {a:>9.3f} {b:>9.3f} {a / b:>9.2f} {rate:>9.1f} {flops:>12.1f}")


if __name__ == "__main__":
    main()
