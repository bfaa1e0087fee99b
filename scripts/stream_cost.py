"""The front end's CPU time per token of one long streamed chat completion, at several lengths:
a per-token cost that grows with the length means some stage redoes the whole output each step.

    python scripts/stream_cost.py [--lengths 1024 4096 8192] [--repeats 3] [--logprobs 0]

Synthetic `CoreOutput`s (one token per step, the embedded model's tokenizer) go through what a
token crosses between the core and the socket when the core has its own process: the output
processor (detokenization, the output handed to the route), the `/v1/chat/completions` route's
chunk building and SSE encoding, and the ASGI app, read by an in-process HTTP client. The clock
is the process's CPU time from the first token fed to the last byte read; the model never runs.
Printed: the median over `--repeats` runs of µs per token at each length, over the whole
stream and over its last 1,024 tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx

from inferd.engine.core.core_output import CoreOutput, SampleDelta
from inferd.engine.frontend.output_processor import OutputProcessor
from inferd.engine.scheduling.step import TokenLogprobs
from inferd.engine_client import EngineStats, ModelInfo
from inferd.loader.default_model import default_model_path
from inferd.server.app import ServerSettings, create_app
from inferd.tokenizer import load_tokenizer

TEXT = "The quick brown fox jumps over the lazy dog, then rests under an old oak tree. "


class SyntheticCore:
    """An EngineClient whose core is a script: each request gets `token_ids`, one per step,
    through a real OutputProcessor (as async_core_client.py runs it on the event loop)."""

    def __init__(self, tokenizer, token_ids: list[int], top_logprobs: int):
        self.tokenizer = tokenizer
        self.model_info = ModelInfo("m", "m", 1 << 20, 262144, "fp")
        self.token_ids = token_ids
        self.top_logprobs = top_logprobs
        self.processor = OutputProcessor(tokenizer)
        self.started_cpu: float | None = None
        self.last_1k_cpu: float | None = None  # when the last 1,024 tokens began

    def start(self) -> None: ...

    def stop(self, timeout: float = 30.0) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def health(self) -> None:
        return None

    def stats(self) -> EngineStats:
        return EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0, 0)

    def observe_outputs(self, callback) -> None: ...

    async def add_request(self, request_id, prompt, params, outputs, arrival_time=None):
        ids = list(prompt["prompt_token_ids"])
        self.processor.add_request(request_id, None, ids, params, time.monotonic(),
                                   params.max_tokens, stream=True)  # fmt: skip
        asyncio.get_running_loop().create_task(self._feed(request_id, params, outputs))

    async def _feed(self, request_id: str, params, outputs: asyncio.Queue) -> None:
        self.started_cpu = time.process_time()
        last = len(self.token_ids) - 1
        alternatives = list(range(100, 100 + self.top_logprobs))
        for i, token in enumerate(self.token_ids):
            if i == max(0, len(self.token_ids) - 1024):
                self.last_1k_cpu = time.process_time()
            logprobs = None
            if params.logprobs is not None:
                logprobs = [TokenLogprobs([token, *alternatives], [-0.5] * (1 + len(alternatives)),
                                          list(range(1, 2 + len(alternatives))))]  # fmt: skip
            delta = SampleDelta(0, [token], logprobs, "length" if i == last else None)
            out = CoreOutput(request_id, [delta], time.monotonic(), None, finished=i == last)
            results, _ = self.processor.process([out], time.monotonic())
            for result in results:
                outputs.put_nowait(result)
            await asyncio.sleep(0)  # the route reads each step's output before the next step


async def one_stream(tokenizer, token_ids: list[int], top_logprobs: int | None
                     ) -> tuple[float, float]:  # fmt: skip
    """µs of CPU per token for one stream of `len(token_ids)` tokens: over all of it, and over
    its last 1,024 tokens (where a cost that grows with the length shows most)."""
    core = SyntheticCore(tokenizer, token_ids, top_logprobs or 0)
    app = create_app(core, ServerSettings(log_requests=False))
    body = {"model": "m", "stream": True, "max_tokens": len(token_ids), "ignore_eos": True,
            "messages": [{"role": "user", "content": "Tell me a story."}]}  # fmt: skip
    if top_logprobs is not None:
        body.update(logprobs=True, top_logprobs=top_logprobs)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as http:
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
        end = time.process_time()
    assert size > len(token_ids) * 50, "the stream ended early"
    tail = min(1024, len(token_ids))
    return ((end - core.started_cpu) / len(token_ids) * 1e6,
            (end - core.last_1k_cpu) / tail * 1e6)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--logprobs", type=int, default=None,
                        help="ask for logprobs with this many top alternatives")  # fmt: skip
    args = parser.parse_args()
    tokenizer = load_tokenizer(default_model_path())
    longest = max(args.lengths)
    ids = tokenizer.encode(TEXT * (longest // 8 + 1), add_special_tokens=False)[:longest]
    asyncio.run(one_stream(tokenizer, ids[:64], args.logprobs))  # warm-up: imports, caches
    what = "plain" if args.logprobs is None else f"logprobs, top {args.logprobs}"
    print(f"chat completion stream ({what}), front-end CPU µs per token, "
          f"median of {args.repeats}:")  # fmt: skip
    for n in args.lengths:
        runs = [asyncio.run(one_stream(tokenizer, ids[:n], args.logprobs))
                for _ in range(args.repeats)]  # fmt: skip
        whole, tail = [r[0] for r in runs], [r[1] for r in runs]
        print(f"  {n:6d} tokens: {statistics.median(whole):7.1f} µs/token, "
              f"last 1,024 tokens {statistics.median(tail):7.1f} µs/token  "
              f"(runs: {', '.join(f'{r:.1f}' for r in whole)})")  # fmt: skip


if __name__ == "__main__":
    main()
