r"""CPU time of the fixed-order attention kernel (inferd_paged_attention) on the embedded model's
shape (4 query heads, 1 KV head of 256), one thread, against PyTorch's causal SDPA on the same
keys gathered into one tensor (float32 and bfloat16): a prefill chunk of N tokens from position
0, and decode steps of S sequences with C cached tokens each.

    python scripts/bench_attention.py                    # prefill 128/512, decode 1/32 x 200
    python scripts/bench_attention.py --cache bfloat16   # on a bf16 cache
    python scripts/bench_attention.py --only prefill --calls 3   # for valgrind/perf runs

CPU time of the calling thread; quote only ratios from one run (docs/performance.md).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from inferd.attention.backend import LayerAttentionSpec  # noqa: E402
from inferd.attention.cpu_backend import RowPlan, attend_in_c  # noqa: E402
from inferd.cpu_kernels import kernel_library  # noqa: E402

H, KV, D, BS = 4, 1, 256, 16


def cpu_ms(fn, calls: int) -> float:
    fn()
    times = []
    for _ in range(calls):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return 1e3 * statistics.median(times)


class Case:
    """`seqs` sequences with `rows` query rows each, the last at position `context - 1`, their
    blocks shuffled in one pool."""

    def __init__(self, seqs: int, rows: int, context: int, dtype: torch.dtype):
        gen = torch.Generator().manual_seed(0)
        width = (context + BS - 1) // BS
        blocks = seqs * width + 1
        self.cache = torch.randn(2, blocks, BS, KV, D, generator=gen).to(dtype)
        table = (torch.randperm(blocks - 1, generator=gen) + 1).view(seqs, width)
        self.q = torch.randn(seqs * rows, H, D, generator=gen)
        lens = torch.arange(context - rows + 1, context + 1).repeat(seqs)
        self.plan = RowPlan(torch.arange(seqs + 1) * rows, lens, table.long().contiguous(),
                            torch.zeros(seqs, dtype=torch.long), BS)  # fmt: skip
        self.spec = LayerAttentionSpec(H, KV, D, 1 / math.sqrt(D), None, None, 0, 0)
        self.table, self.seqs, self.rows, self.context = table, seqs, rows, context

    def kernel(self, lib):
        return attend_in_c(lib, self.q, self.cache, self.plan, self.spec)

    def sdpa(self, dtype: torch.dtype):
        """PyTorch on the keys gathered per sequence (the gather is not timed)."""
        k, v = (self.cache[i][self.table].reshape(self.seqs, -1, KV, D)[:, : self.context]
                for i in (0, 1))  # fmt: skip
        k = k.transpose(1, 2).repeat_interleave(H // KV, 1).to(dtype)
        v = v.transpose(1, 2).repeat_interleave(H // KV, 1).to(dtype)
        q = self.q.view(self.seqs, self.rows, H, D).transpose(1, 2).to(dtype)
        mask = None
        if self.rows > 1:
            pos = torch.arange(self.context - self.rows, self.context)
            mask = pos[:, None] >= torch.arange(self.context)[None, :]
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--only", default="", help="cases whose name contains this")
    parser.add_argument("--calls", type=int, default=11)
    parser.add_argument("--no-torch", action="store_true", help="time the kernel only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lib, dtype = kernel_library(), getattr(torch, args.cache)
    cases = {"prefill 128": (1, 128, 128), "prefill 512": (1, 512, 512),
             "decode 1 x 200": (1, 1, 200), "decode 32 x 200": (32, 1, 200)}  # fmt: skip
    print(f"ms per call, one thread, CPU time, {args.cache} cache, H={H} KV={KV} D={D}")
    for name, shape in cases.items():
        if args.only not in name:
            continue
        case = Case(*shape, dtype)
        line = [f"{name:16s} kernel {cpu_ms(functools.partial(case.kernel, lib), args.calls):8.3f}"]
        if not args.no_torch:
            for t in (torch.float32, torch.bfloat16):
                line.append(f"sdpa {str(t)[6:]} {cpu_ms(case.sdpa(t), args.calls):8.3f}")
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
