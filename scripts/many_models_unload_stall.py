"""How long unloading a model holds the server's event loop: a tiny random Llama GGUF model in its
own engine core process, loaded and unloaded by the pool of a server of many models
(server/multimodel/pool.py), with its engine stopped off the loop (commands/serve_model_stop.py)
and, for comparison, by the app's shutdown alone (the engine client's stop() waits for the core
on the loop). A coroutine ticking every millisecond measures the longest gap while the unload
runs (docs/server.md, Many models). Run: .venv/bin/python scripts/many_models_unload_stall.py"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


async def unload_once(pool, stop_engine) -> tuple[float, float]:
    """(seconds the unload took, the event loop's longest stall meanwhile)."""
    pool.stop_engine = stop_engine
    pool.release(await pool.acquire("tiny"))
    gaps: list[float] = []
    done = False

    async def tick() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0.05)
    started = time.perf_counter()
    await pool._start_unload(pool.slots["tiny"], "measured")
    took = time.perf_counter() - started
    done = True
    await ticker
    return took, max(gaps)


def main() -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    os.environ["INFERD_WEIGHT_CACHE"] = "0"
    from tiny_gguf import write_tiny_gguf

    from inferd.commands.serve_args import add_arguments
    from inferd.commands.serve_models import build_server

    folder = Path(tempfile.mkdtemp())
    write_tiny_gguf(folder / "tiny.gguf", "llama")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", f"tiny={folder / 'tiny.gguf'}", "--model",
                              f"other={folder / 'other.gguf'}", "--kv-cache-memory", "16MiB",
                              "--max-model-len", "256"])  # fmt: skip
    app, _ = build_server(args)
    pool = app.app.pool  # CORS → the dispatcher
    off_loop = pool.stop_engine
    for label, stop in [("shutdown only", None), ("stopped off the loop", off_loop)] * 2:
        took, stall = asyncio.run(unload_once(pool, stop))
        print(f"{label:22s} unload {took * 1000:5.0f} ms, longest event-loop stall "
              f"{stall * 1000:5.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
