"""`inferd models`: the models inferd knows by name, which are in the cache, their sizes, and
which command uses which by default. `inferd cache` shows (and removes) everything cached."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the list as JSON")


def model_rows() -> list[dict]:
    from inferd.loader.catalog import CATALOG, DEFAULT_FOR, is_present

    rows = []
    for m in CATALOG:
        present = is_present(m)
        rows.append(
            {
                "name": m.name,
                "role": m.role,
                "default_for": DEFAULT_FOR[m.role],
                "present": present,
                "size_bytes": m.path.stat().st_size if present else m.file_size,
                "file": m.file_name,
                "path": str(m.path),
                "source": f"{m.package}=={m.version}",
                "license": m.license,
                "summary": m.summary,
                "get_it": ("assembled on first use" if m.embedded else f"inferd pull {m.name}"),
            }
        )
    return rows


def run(args: argparse.Namespace) -> int:
    rows = model_rows()
    if args.json:
        import json

        print(json.dumps(rows, indent=1))
        return 0
    from inferd.loader.catalog import models_dir

    print(f"{'NAME':<24} {'SIZE':>9}  {'DEFAULT FOR':<30} STATE")
    for r in rows:
        size = f"{r['size_bytes'] / (1 << 20):.0f} MiB"
        state = "in the cache" if r["present"] else f"not in the cache: {r['get_it']}"
        print(f"{r['name']:<24} {size:>9}  {r['default_for']:<30} {state}")
        print(f"{'':<24} {r['summary']}")
        print(f"{'':<24} file {r['file']}, {r['license']}, from {r['source']}")
    print(f"files: {models_dir()}   (--model NAME works with every command)")
    return 0
