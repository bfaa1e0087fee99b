"""A batch's cost to interactive clients (issue 56's "Must show"): on one `inferd serve`, an
interactive client's time to first token (TTFT) alone, then while a batch of N lines runs
through /v1/batches; prints p50/p99 TTFT of both phases, their ratio, and the batch's time and
request counts.

    python scripts/batch_interference.py [--lines 200] [--samples 40] [-- SERVE FLAGS]

e.g. `-- --scheduling-policy priority` or `-- --batch-concurrency 4`. The interactive client
sends one streamed /v1/completions at a time (a fresh prompt each, so no prefix-cache hit; 4
tokens), with a short pause between, as a person at a prompt would; the batch's lines are
/v1/completions of 16 tokens each. During the batch the client keeps sending until the batch
ends (at least --samples requests). The alone phase runs both before and after the batch (each
--samples requests) and its figures pool the two: on a machine shared with other work the load
drifts over a run's minutes, and a ratio against one side only would measure the drift.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from serving_overhead import _start_server  # noqa: E402

WORDS = "river stone lantern orchard violet meadow copper harbor candle willow".split()


def prompt(i: int, salt: str) -> str:
    """A distinct ~40-token prompt: no two share more than a few tokens of prefix."""
    words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(24)]
    return f"{salt} {i}: write about " + " ".join(words)


def ttft(client, model: str, text: str) -> float:
    start = time.perf_counter()
    stream = client.completions.create(model=model, prompt=text, max_tokens=4, stream=True,
                                       temperature=0)  # fmt: skip
    first = None
    for _ in stream:
        if first is None:
            first = time.perf_counter() - start
    return first


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--pause", type=float, default=0.2, help="seconds between requests")
    parser.add_argument("serve_flags", nargs=argparse.REMAINDER, help="after --: serve flags")
    args = parser.parse_args()
    flags = [f for f in args.serve_flags if f != "--"]
    from openai import OpenAI

    proc, url, log = _start_server(flags)
    try:
        client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        for i in range(3):  # warm-up: the first requests pay for one-time work
            ttft(client, model, prompt(i, "warm"))
        alone = []
        for i in range(args.samples):
            alone.append(ttft(client, model, prompt(i, "alone")))
            time.sleep(args.pause)
        lines = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions",
                  "body": {"model": model, "prompt": prompt(i, "batch"), "max_tokens": 16,
                           "temperature": 0}} for i in range(args.lines)]  # fmt: skip
        data = "".join(json.dumps(x) + "\n" for x in lines).encode()
        upload = client.files.create(file=("lines.jsonl", data), purpose="batch")
        start = time.perf_counter()
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions",
                                      completion_window="24h")  # fmt: skip
        during, i = [], 0
        while True:
            batch = client.batches.retrieve(batch.id)
            if batch.status in ("completed", "failed", "cancelled", "expired"):
                break
            if batch.status == "in_progress" or len(during) < args.samples:
                during.append(ttft(client, model, prompt(i, "during")))
                i += 1
            time.sleep(args.pause)
        took = time.perf_counter() - start
        after = []
        for i in range(args.samples):
            after.append(ttft(client, model, prompt(i, "after")))
            time.sleep(args.pause)
        for file_id in (upload.id, batch.output_file_id, batch.error_file_id):
            if file_id:
                client.files.delete(file_id)
    finally:
        proc.terminate()
        proc.wait(60)
        os.unlink(log)
    counts = batch.request_counts
    print(f"serve flags: {' '.join(flags) or '(defaults)'}")
    print(
        f"batch: {args.lines} lines, status {batch.status}, completed {counts.completed}, "
        f"failed {counts.failed}, {took:.1f} s"
    )
    before, alone = alone, alone + after
    for name, values in (("alone before", before), ("alone after", after), ("alone", alone),
                         ("during batch", during)):  # fmt: skip
        print(
            f"TTFT {name:>12}: n={len(values):3d}  p50 {1000 * statistics.median(values):7.1f} "
            f"ms  p99 {1000 * percentile(values, 0.99):7.1f} ms"
        )
    print(
        f"ratio during/alone: p50 {statistics.median(during) / statistics.median(alone):.2f}  "
        f"p99 {percentile(during, 0.99) / percentile(alone, 0.99):.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
