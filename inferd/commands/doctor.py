"""`inferd doctor`: what a bug report needs to know about this machine and this install.

The CPU and the features inferd's kernels and dtypes depend on, the C compiler, which kernel
variant runs here and why (building it if the cache lacks it, as engine start-up would), the
cache directory, whether weights move into huge pages, the torch build, CUDA, and the thread
settings. `--json` prints the same facts as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the facts as one JSON object")


def _kernel_facts() -> dict[str, object]:
    from inferd.cpu_kernels import build, variants
    from inferd.cpu_kernels.startup import status_line

    facts: dict[str, object] = {
        variants.ENV: os.environ.get(variants.ENV, "(unset: auto)"),
        "kernel variants": variants.describe(),
    }
    try:
        cc = build.compiler()
        facts["compiler"] = f"{cc}: {build.compiler_version(cc).splitlines()[0]}"
    except build.KernelsUnavailable as e:
        facts["compiler"] = f"none ({e})"
    try:
        kernels = build.current_kernels()
        facts["cpu kernels"] = status_line(kernels).removeprefix("cpu kernels: ")
        facts["why this variant"] = kernels.reason
        facts["kernel library"] = str(kernels.path)
    except (build.KernelsUnavailable, ValueError) as e:
        facts["cpu kernels"] = f"none ({e}); PyTorch ops serve instead"
        kernels = None
    facts.update(_default_modes(kernels is not None))
    return facts


def _default_modes(kernels: bool) -> dict[str, str]:
    """What `inferd generate` / `serve` / `LLM()` with no mode flags hold on this CPU
    (inferd/layers/weight_scheme.py decides the same at load; docs/performance.md)."""
    from inferd.cpu_info import default_cpu_dtype

    dense = default_cpu_dtype()
    gguf = f"{dense} weights dequantised from the file (no C kernels)"
    if kernels:
        gguf = "gguf: the file's blocks with C kernels at every step size"
    return {"default on this CPU, GGUF file": gguf,
            "default on this CPU, HF folder": f"{dense} weights"}  # fmt: skip


def _huge_pages_fact() -> str:
    """Whether a model's cached blocks move into huge pages after load (loader/huge_pages.py)."""
    from inferd.loader import huge_pages

    reason = huge_pages.why_not()
    return "yes, after load" if reason is None else f"no: {reason}"


def _torch_facts() -> dict[str, object]:
    import torch

    from inferd.engine.transport.core_spin import CORE_SPIN_COUNT, SPIN_COUNT_ENV, USER_KNOBS

    cuda = torch.cuda.is_available()
    facts: dict[str, object] = {
        "torch": f"{torch.__version__} (CUDA build: {torch.version.cuda or 'no'})",
        "torch CPU capability": torch.backends.cpu.get_cpu_capability(),
        "CUDA available": cuda,
    }
    if cuda:
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        facts["CUDA devices"] = ", ".join(names)
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    facts["threads"] = (f"torch {torch.get_num_threads()} (inter-op "
                        f"{torch.get_num_interop_threads()}); cores usable {affinity or '?'} "
                        f"of {os.cpu_count()}")  # fmt: skip
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        facts[name] = os.environ.get(name, "(unset)")
    if not any(name in os.environ for name in USER_KNOBS):
        facts[SPIN_COUNT_ENV] += f" (an engine core process gets {CORE_SPIN_COUNT})"
    return facts


def collect() -> dict[str, object]:
    """The facts, in the order they print."""
    from inferd.cache import cache_dir
    from inferd.cpu_info import (
        FEATURES_OFF_ENV,
        NOTABLE_FEATURES,
        cpu_flags,
        cpu_model,
        disabled_by_os,
        features_off,
        machine,
    )
    from inferd.version import __version__

    flags = cpu_flags()
    facts: dict[str, object] = {
        "inferd": __version__,
        "python": f"{platform.python_version()} on {platform.platform()}",
        "cpu": f"{cpu_model()} ({machine()})",
        "cpu features": " ".join(f for f in NOTABLE_FEATURES if f in flags) or "(none found)",
        FEATURES_OFF_ENV: " ".join(features_off()) or "(unset)",
    }
    if disabled := disabled_by_os():
        facts["listed, not enabled by the OS"] = " ".join(disabled) + " (treated as absent)"
    facts["cache"] = str(cache_dir())
    facts["weights in huge pages"] = _huge_pages_fact()
    facts.update(_kernel_facts())
    facts.update(_torch_facts())
    return facts


def run(args: argparse.Namespace) -> int:
    facts = collect()
    if args.json:
        print(json.dumps(facts, indent=2, default=str))
        return 0
    width = max(len(k) for k in facts)
    for key, value in facts.items():
        if isinstance(value, list):
            print(f"{key}:")
            for item in value:
                print(f"  {item}")
        else:
            print(f"{key + ':':<{width + 1}} {value}")
    sys.stdout.flush()
    return 0
