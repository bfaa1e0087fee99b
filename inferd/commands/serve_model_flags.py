"""The flags of many models in one server (`--model NAME=PATH`, `--models-dir`,
`--max-loaded-models`, `--max-loaded-memory`, `--idle-unload`): their definitions, whether they
ask for several models, and the name → path of each. Kept apart from serve_models.py (which
builds the server) so that the flag checks of other serving modes can ask `serves_many` without
importing the server they do not build.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

DEFAULT_MAX_LOADED = 1
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
# Flags about one model's own things, refused with several models: (dest, why).
_PER_MODEL_FLAGS = (
    ("served_model_name", "each model is served under its NAME (--model NAME=PATH) or its "
     "file or folder name (--models-dir)"),
    ("chat_template", "one template cannot fit every model; each uses its own"),
    ("lora_modules", "an adapter belongs to one base model: serve that model alone"),
    ("enable_lora", "adapters are served only with one model"),
    ("allow_runtime_lora_updating", "adapters are served only with one model"),
    ("ray", "Ray Serve runs one model per application: run one application per model"),
)  # fmt: skip


def add_models_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models-dir",
        default=None,
        metavar="DIR",
        help="serve every GGUF file (named by its file name without .gguf) and HF folder (with "
        "a config.json, named by the folder's name) in DIR, loaded on request (default: none)",
    )
    parser.add_argument(
        "--max-loaded-models",
        type=int,
        default=None,
        metavar="N",
        help="with several models: most models loaded at once; loading another unloads the "
        f"least recently used idle one (default {DEFAULT_MAX_LOADED})",
    )
    parser.add_argument(
        "--max-loaded-memory",
        type=_size,
        default=None,
        metavar="SIZE",
        help="with several models: most memory the loaded models may hold together (weights, "
        "KV pool and runtime of every engine process, estimated before a load and measured "
        "after it), e.g. 8GiB; loading another unloads the least recently used idle ones until "
        "it fits (default: no budget)",
    )
    parser.add_argument(
        "--idle-unload",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with several models: unload a model that had no request for this many seconds "
        "(default: never; it stays until another model needs its seat)",
    )


def _size(text: str) -> int:
    from inferd.commands.engine_args import size_arg

    return size_arg(text)


def _split(value: str) -> tuple[str | None, str]:
    """(NAME, PATH) of `NAME=PATH`; (None, value) for a plain path or catalog name. A value that
    is an existing path stays a path even with a '=' in it."""
    name, eq, path = value.partition("=")
    if not eq or os.path.exists(value) or not _NAME.fullmatch(name):
        return None, value
    return name, path


def serves_many(args: argparse.Namespace) -> bool:
    """Whether the flags ask for several models (checked: a mix that means nothing is refused)."""
    values = getattr(args, "models", None) or []
    named = [v for v in values if _split(v)[0] is not None]
    many = bool(args.models_dir or named or len(values) > 1)
    if not many:
        for flag in ("max_loaded_models", "max_loaded_memory", "idle_unload"):
            if getattr(args, flag) is not None:
                raise ValueError(f"--{flag.replace('_', '-')}: only with several models "
                                 "(--model NAME=PATH, --models-dir)")  # fmt: skip
        return False
    if len(named) != len(values):
        plain = next(v for v in values if _split(v)[0] is None)
        raise ValueError(f"--model {plain}: with several models give each as --model NAME=PATH")
    if args.model_pos:
        raise ValueError(f"MODEL {args.model_pos}: with several models give each as "
                         "--model NAME=PATH")  # fmt: skip
    return True


def model_specs(args: argparse.Namespace) -> dict[str, str]:
    """name → path (or catalog name) of every model served; refuses two names for one path."""
    pairs = [_split(v) for v in args.models]
    if args.models_dir:
        pairs += _scan(Path(args.models_dir))
    specs: dict[str, str] = {}
    owner: dict[str, str] = {}  # the model's identity → the name that serves it
    for name, path in pairs:
        if name in specs:
            raise ValueError(f"--model {name}={path}: the name {name!r} is already served "
                             f"({specs[name]})")  # fmt: skip
        key = _identity(path)
        if key in owner:
            raise ValueError(f"--model {name}={path}: {path} is already served as "
                             f"{owner[key]!r}; serve one model under one name")  # fmt: skip
        specs[name], owner[key] = path, name
    return specs


def _scan(folder: Path) -> list[tuple[str, str]]:
    if not folder.is_dir():
        raise ValueError(f"--models-dir {folder}: not a folder")
    found = []
    for entry in sorted(folder.iterdir()):
        if entry.is_file() and entry.suffix == ".gguf":
            found.append((entry.stem, str(entry)))
        elif entry.is_dir() and (entry / "config.json").is_file():
            found.append((entry.name, str(entry)))
    if not found:
        raise ValueError(f"--models-dir {folder}: no GGUF file or HF folder (with config.json)")
    return found


def _identity(path: str) -> str:
    if os.path.exists(path):
        return os.path.realpath(path)
    from inferd.loader.catalog import lookup

    model = lookup(path)  # a catalog name: its file
    return os.path.realpath(model.path) if model is not None else path


def check_many(args: argparse.Namespace) -> None:
    """Refuse what cannot work per model, naming the flag."""
    for dest, why in _PER_MODEL_FLAGS:
        if getattr(args, dest, None):
            raise ValueError(f"--{dest.replace('_', '-')}: not with several models: {why}")
    if args.max_loaded_models is not None and args.max_loaded_models < 1:
        raise ValueError(f"--max-loaded-models must be at least 1, got {args.max_loaded_models}")
    if args.idle_unload is not None and not args.idle_unload > 0:
        raise ValueError(f"--idle-unload must be a number of seconds > 0, got {args.idle_unload}")
    if args.max_loaded_memory is not None and args.kv_cache_memory is None:
        from inferd.platform import resolve_device

        if resolve_device(args.device).type == "cuda":
            raise ValueError("--max-loaded-memory on a GPU needs --kv-cache-memory: without it "
                             "each model's engine sizes its KV pool to fill "
                             "--gpu-memory-utilization of the device, so no budget could hold "
                             "two models")  # fmt: skip
    from inferd.distributed.launch import launched_by_torchrun

    if launched_by_torchrun():  # its ranks would have to build every model in step
        raise ValueError("several models are not served under torchrun: launch inferd serve "
                         "directly (--tensor-parallel-size starts each model's ranks)")  # fmt: skip
