"""`inferd serve`'s LoRA flag with vLLM's name: `--lora-modules name=path ...` (the adapters a
request's `model` can name; the engine's --enable-lora, --max-loras, --max-lora-rank and
--max-cpu-loras are engine flags, engine_args.py). Each adapter's config is checked at start-up,
so a bad folder stops the server before it listens."""

from __future__ import annotations

import argparse
import os

from inferd.loader.lora_adapter import read_adapter_config
from inferd.lora_request import LoRARequest


def add_lora_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                        help="LoRA adapters (PEFT folders) served under NAME; needs "
                             "--enable-lora (default: none)")  # fmt: skip
    parser.add_argument("--allow-runtime-lora-updating", action="store_true",
                        help="offer POST /v1/load_lora_adapter and /v1/unload_lora_adapter "
                             "(vLLM: VLLM_ALLOW_RUNTIME_LORA_UPDATING=true, honoured too); "
                             "needs --enable-lora")  # fmt: skip


def runtime_updating(args: argparse.Namespace) -> bool:
    """Whether the load/unload routes are offered; raises ValueError without --enable-lora."""
    env = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true")
    wanted = args.allow_runtime_lora_updating or env
    if wanted and not args.enable_lora:
        raise ValueError("--allow-runtime-lora-updating needs --enable-lora")
    return wanted


def lora_modules(args: argparse.Namespace) -> list[LoRARequest]:
    """The adapters of --lora-modules, ids 1, 2, ... in the order given; raises ValueError."""
    specs = args.lora_modules or []
    if specs and not args.enable_lora:
        raise ValueError("--lora-modules needs --enable-lora")
    out = []
    for i, spec in enumerate(specs, start=1):
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora-modules: {spec!r} is not NAME=PATH")
        read_adapter_config(path, args.max_lora_rank)
        out.append(LoRARequest(name, i, path))
    return out
