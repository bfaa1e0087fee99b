"""Compile the attention kernels for a GPU target without a GPU: Triton's front end, its NVIDIA
passes and the bundled ptxas all run on any machine. The interpreter tests check what the
kernels compute; this checks that they are valid compiled Triton (the interpreter runs plain
Python and accepts constructs the compiler rejects) and reports registers, spills and shared
memory per program, the first things to look at before tuning on a real device.

    python -m inferd.attention.triton_kernels.compile_check [--arch 90] [--quick]

Arguments are typed as a launch would specialise them: 16-byte-aligned pointers, strides
divisible by 16, unit strides on head_dim folded to the constant 1. With `INT8` the cache
pointers are int8 and the cache strides carry no divisibility (inferd/kv_int8.py: rows of
head_dim + 4 bytes, which Triton's launch does not find divisible by 16).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from inferd.attention.triton_kernels.common import decode_tiles, prefill_tiles
from inferd.attention.triton_kernels.decode import _decode_kernel, _reduce_kernel
from inferd.attention.triton_kernels.prefill import _prefill_kernel
from inferd.attention.triton_kernels.store_kv import _store_kv_kernel

_INT_POINTERS = {"work_ptr", "seq_ids_ptr", "query_start_ptr", "seq_lens_ptr", "block_tables_ptr"}


def _signature(fn, dtype: str, constexprs: dict) -> tuple[dict, dict, dict]:
    constexprs = dict(constexprs)
    int8 = constexprs.get("INT8", False)
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name.startswith("stride_") and name.endswith("d"):
            constexprs[name] = 1  # head_dim is contiguous in every tensor the backend passes
        if name in constexprs:
            sig[name] = "constexpr"
            continue
        if name.endswith("_ptr"):
            if name in _INT_POINTERS:
                sig[name] = "*i32"
            elif name == "slot_ptr":
                sig[name] = "*i64"
            elif name.startswith("part_"):
                sig[name] = "*fp32"
            elif int8 and name in ("k_cache_ptr", "v_cache_ptr"):
                sig[name] = "*i8"
            else:
                sig[name] = "*" + dtype
        else:
            sig[name] = "fp32" if name in ("scale", "softcap") else "i32"
        if int8 and name.startswith("stride_c"):
            continue  # rows of head_dim + 4 bytes: a launch sees no stride divisible by 16
        if name.endswith("_ptr") or name.startswith("stride_"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, constexprs, attrs


def _ptxas_usage(ptx: str, arch: int) -> str:
    folder = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    for tool in ("ptxas-blackwell", "ptxas"):  # the newer one reads the PTX version Triton emits
        path = os.path.join(folder, tool)
        if not os.path.exists(path):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "k.ptx")
            with open(src, "w") as f:
                f.write(ptx)
            run = subprocess.run(
                [path, f"-arch=sm_{arch}a", "-v", src, "-o", os.path.join(tmp, "k.o")],
                capture_output=True,
                text=True,
            )
        regs = re.search(r"Used (\d+) registers", run.stderr)
        spills = re.search(r"(\d+) bytes spill stores", run.stderr)
        if regs:
            return f"{regs.group(1)} registers, {spills.group(1) if spills else 0} B spilled"
    return "registers unknown"


def compile_kernel(fn, dtype: str, constexprs: dict, num_warps: int, arch: int = 90) -> str:
    """Compile one specialisation; returns a one-line resource report."""
    sig, constexprs, attrs = _signature(fn, dtype, constexprs)
    src = ASTSource(fn, sig, constexprs, attrs)
    kernel = triton.compile(
        src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps}
    )
    usage = _ptxas_usage(kernel.asm["ptx"], arch)
    return f"{fn.__name__} {dtype}: {usage}, {kernel.metadata.shared} B shared"


def configurations(quick: bool):
    """(kernel, dtype, constexprs, num_warps) for the shapes that matter: each dtype with a cache
    of its own dtype, and bf16 with an int8 cache."""
    shapes = [(256, 4)] if quick else [(256, 4), (128, 4), (128, 8), (64, 1)]
    dtypes = ["bf16"] if quick else ["bf16", "fp16", "fp32"]
    for head_dim, group in shapes:
        for dtype, int8 in [(d, False) for d in dtypes] + [("bf16", True)]:
            pre = prefill_tiles(head_dim, group, exact_fp32=dtype == "fp32")
            dec = decode_tiles(head_dim, group)
            flags = dict(HAS_SOFTCAP=True, INTERPRETED=False, IEEE=dtype == "fp32", BLOCK_SIZE=16,
                         INT8=int8)  # fmt: skip
            yield (
                _prefill_kernel,
                dtype,
                dict(
                    flags,
                    GROUP=group,
                    GROUP_PAD=pre.group_pad,
                    HEAD_DIM=head_dim,
                    HEAD_PAD=pre.head_pad,
                    BLOCK_Q=pre.block_q,
                    BLOCK_N=pre.block_n,
                    WINDOW=512,
                ),
                pre.num_warps,
            )
            split = dict(
                NUM_HEADS=2 * group,
                HEAD_DIM=head_dim,
                HEAD_PAD=dec.head_pad,
                BLOCK_N=dec.block_n,
                WINDOW=0,
                NUM_PARTS=8,
                INDIRECT=True,
                INTERPRETED=False,
            )
            decode = dict(split, **flags, GROUP=group, GROUP_PAD=dec.group_pad)
            yield _decode_kernel, dtype, decode, dec.num_warps
            if not int8:  # the reduce reads no cache
                yield _reduce_kernel, dtype, split, 4
        heads = dict(KV_HEADS=2, HEADS_PAD=2, HEAD_DIM=head_dim, BLOCK_SIZE=16, INTERPRETED=False)
        for int8 in (False, True):
            yield _store_kv_kernel, "bf16", dict(heads, HEAD_PAD=pre.head_pad, INT8=int8), 4


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 80, 90")
    parser.add_argument("--quick", action="store_true", help="Gemma 3's shape in bf16 only")
    args = parser.parse_args(argv)
    for fn, dtype, constexprs, warps in configurations(args.quick):
        shape = f"head_dim={constexprs['HEAD_DIM']} group={constexprs.get('GROUP', '-')}"
        shape += " int8 cache" * constexprs.get("INT8", False)
        print(f"{compile_kernel(fn, dtype, constexprs, warps, args.arch)} [{shape}]", flush=True)


if __name__ == "__main__":
    main()
