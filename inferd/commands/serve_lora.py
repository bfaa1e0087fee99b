"""`inferd serve`'s LoRA flag with vLLM's name: `--lora-modules name=path ...` (the adapters a
request's `model` can name; the engine's --enable-lora, --max-loras, --max-lora-rank and
--max-cpu-loras are engine flags, engine_args.py). Each adapter's config is checked at start-up,
so a bad folder stops the server before it listens."""

from __future__ import annotations

import argparse

from inferd.loader.lora_adapter import read_adapter_config
from inferd.lora_request import LoRARequest


def add_lora_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                        help="LoRA adapters (PEFT folders) served under NAME; needs "
                             "--enable-lora")  # fmt: skip


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
