"""`inferd cache`: what inferd keeps under its cache folder, and removing it.

    inferd cache                        # every entry with its size (models, weights, ...)
    inferd cache --prune                # converted weights the current defaults do not load
    inferd cache --remove smollm2-135m-instruct   # a model and its converted copies
    inferd cache --remove weights       # one kind: models, weights, tokenizers, kernels, ...
    inferd cache --all                  # everything inferd wrote there

Nothing asks for confirmation (scripts use these flags). Everything here is rebuilt on demand,
except pulled models, which `inferd pull` fetches again.
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from inferd.cache import SUM_SUFFIX

KINDS = {
    "models": "model files (the embedded one is assembled again on use; pulled ones: pull)",
    "weights": "converted weights for a fast start (rebuilt on the next start)",
    "tokenizers": "tokenizers built from GGUF vocabularies (rebuilt on use)",
    "kernels": "compiled CPU kernels (compiled again on use)",
    "structured": "vocabularies as the grammar engine reads them (rebuilt on use)",
}


@dataclass
class Entry:
    kind: str
    path: Path
    size: int
    label: str = ""  # what it is, from a stamp or metadata file when there is one
    in_use: bool = True  # False: --prune removes it

    def to_dict(self) -> dict:
        return {"kind": self.kind, "path": str(self.path), "size_bytes": self.size,
                "label": self.label, "in_use": self.in_use}  # fmt: skip


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _sidecars(path: Path) -> list[Path]:
    """Where a small file about a cached file may sit beside it (stamp, metadata, checksum)."""
    if path.parent.name == "tokenizers":  # its .json files are entries (tokenizer.json) too
        return [path.with_name(path.name + SUM_SUFFIX)]
    names = {path.with_suffix(".json"), path.with_suffix(".verified.json"),
             path.with_name(path.name + ".json"),
             path.with_name(path.name + SUM_SUFFIX)}  # fmt: skip
    return [p for p in names if p != path]


def _sidecar(path: Path) -> dict:
    """The small JSON written beside a cached file, if any (fields vary by writer)."""
    for candidate in _sidecars(path):
        try:
            data = json.loads(candidate.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            continue
    return {}


def default_weight_copies() -> set[Path]:
    """The converted-weight entries the current defaults load: the packed blocks of each
    present catalog model (one entry per GGUF file, shared by every mode that keeps blocks)."""
    from inferd.loader import gguf_cache, weight_cache
    from inferd.loader.catalog import CATALOG, is_present

    return {weight_cache.entry_path(model.path, gguf_cache.MODE, 0, 1)
            for model in CATALOG if is_present(model)}  # fmt: skip


def inventory(root: Path) -> list[Entry]:
    from inferd.loader.catalog import CATALOG

    by_file = {m.file_name: m for m in CATALOG}
    in_use_weights = default_weight_copies() if (root / "weights").is_dir() else set()
    entries: list[Entry] = []
    for kind in KINDS:
        folder = root / kind
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.suffix == ".json" and kind in ("models", "weights"):
                continue  # a stamp or sidecar: listed with its file
            if path.name.endswith(SUM_SUFFIX):
                continue  # a checksum (inferd/cache.py): removed with its file
            entry = Entry(kind, path, _size(path))
            meta = _sidecar(path)
            if path.name.endswith(".part") or path.name.startswith(".download-"):
                entry.label, entry.in_use = "left by an interrupted write", False
            elif kind == "models":
                model = by_file.get(path.name)
                entry.label = model.name if model else meta.get("name", "")
            elif kind == "weights":
                entry.in_use = path in in_use_weights
                described = [
                    str(meta[k]) for k in ("model", "source", "mode", "dtype") if k in meta
                ]
                entry.label = " ".join(described) or "converted weights"
                entry.label += "" if entry.in_use else " (not used by the current defaults)"
            entries.append(entry)
    return entries


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    for sidecar in _sidecars(path):
        sidecar.unlink(missing_ok=True)


def remove_named(root: Path, name: str) -> list[Path]:
    """A kind, a catalog model (its file and its converted copies), or an entry's file name."""
    from inferd.loader.catalog import lookup

    entries = inventory(root)
    if name in KINDS:
        chosen = [e.path for e in entries if e.kind == name]
    elif (model := lookup(name)) is not None:
        chosen = [e.path for e in entries if e.path == model.path]
        chosen += [e.path for e in entries if e.kind == "weights" and _is_copy_of(e.path, model)]
    else:
        chosen = [e.path for e in entries if e.path.name == name]
        if not chosen:
            raise ValueError(
                f"--remove: nothing named {name!r} in {root}; give a kind "
                f"({', '.join(KINDS)}), a model name, or a file name that `inferd cache` lists"
            )
    for path in chosen:
        _remove(path)
    return chosen


def _is_copy_of(path: Path, model) -> bool:
    """Whether converted weights at `path` came from `model`'s file: by the description written
    beside the entry (loader/weight_cache.py), else by the key the current layout gives it."""
    from inferd.loader import gguf_cache, weight_cache

    meta = _sidecar(path)
    source = meta.get("model") or meta.get("source")
    if source:
        return Path(source).name == model.file_name
    if not model.path.exists():
        return False
    return path == weight_cache.entry_path(model.path, gguf_cache.MODE, 0, 1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--prune", action="store_true",
                        help="remove converted weights the current defaults do not load, and "
                             "files left by interrupted writes")  # fmt: skip
    action.add_argument("--remove", metavar="NAME", action="append", default=None,
                        help=f"remove a kind ({', '.join(KINDS)}), a model by name with its "
                             "converted weights, or one file; repeatable "
                             "(default: none)")  # fmt: skip
    action.add_argument(
        "--all", action="store_true", help="remove everything inferd keeps in its cache folder"
    )
    parser.add_argument("--json", action="store_true", help="print the listing as JSON")


def run(args: argparse.Namespace) -> int:
    from inferd.cache import cache_dir

    root = cache_dir()
    removed: list[Path] = []
    if args.all:
        removed = [root / kind for kind in KINDS if (root / kind).exists()]
        for path in removed:
            shutil.rmtree(path)
    elif args.prune:
        removed = [e.path for e in inventory(root) if not e.in_use]
        for path in removed:
            _remove(path)
    elif args.remove:
        for name in args.remove:
            removed += remove_named(root, name)
    if args.all or args.prune or args.remove:
        for path in removed:
            print(f"removed {path}")
        if not removed:
            print("nothing to remove")
        return 0
    from inferd.loader import weight_cache

    entries = inventory(root)
    limit = weight_cache.budget()
    if args.json:
        print(json.dumps({"cache_dir": str(root), "weights_limit_bytes": limit,
                          "entries": [e.to_dict() for e in entries]}, indent=1))  # fmt: skip
        return 0
    print(f"{root}: {_mib(sum(e.size for e in entries))} in all")
    for kind, what in KINDS.items():
        mine = [e for e in entries if e.kind == kind]
        if kind == "weights":  # the one kind kept within a size
            what += (f"; at most {_mib(limit)} (--weight-cache-size, "
                     "INFERD_WEIGHT_CACHE_SIZE), least recently used removed first")  # fmt: skip
        print(f"{kind:<11} {_mib(sum(e.size for e in mine)):>10}  {what}")
        for e in mine:
            print(f"  {_mib(e.size):>10}  {e.path.name}  {e.label}".rstrip())
    return 0


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"
