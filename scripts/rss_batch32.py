"""Resident memory of the embedded model around a 32-request batch (issue 26's memory target):
`LLM()`, 32 prompts of ~129 tokens, 16 tokens each, the process's RSS (anonymous and
file-backed parts) after each stage, and what glibc's malloc held that `malloc_trim` returns.

    python scripts/rss_batch32.py                 # the default mode, two threads
    python scripts/rss_batch32.py --threads 1
"""

from __future__ import annotations

import argparse
import ctypes
import os


def status() -> dict[str, int]:
    """VmRSS, RssAnon, RssFile and VmHWM of this process, in MiB."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                fields[key] = int(value.split()[0]) // 1024
    return fields


def show(stage: str) -> None:
    s = status()
    print(f"{stage:36s} RSS {s['VmRSS']:5d} MiB  anon {s['RssAnon']:5d}  file {s['RssFile']:5d}"
          f"  peak {s['VmHWM']:5d}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--kv-cache-dtype", default="auto")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    show("after import torch")
    from inferd import LLM, SamplingParams

    llm = LLM(kv_cache_dtype=args.kv_cache_dtype)
    show("after LLM()")
    words = "the quick brown fox jumps over the lazy dog and then some more words follow "
    prompts = [f"{i}: " + words * 9 for i in range(args.requests)]
    lengths = [len(llm.get_tokenizer().encode(p)) for p in prompts[:2]]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    llm.generate(prompts, params)
    show(f"after {args.requests} x 16 tokens ({lengths[0]} tokens)")
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    show("after malloc_trim(0)")


if __name__ == "__main__":
    main()
