"""What the server's front end spends on one streamed token, with warm caches and with caches
just swept, as they are when a token arrives right after a forward pass.

    python scripts/front_end_cost.py [--tokens 128] [--requests 16]

Per token: the output processor's step (detokenization, stop strings, the output built with its
metrics snapshot) and the SSE event's encoding, on the embedded model's tokenizer. "cold" sweeps
a 64 MiB buffer before each token (the embedded model's forward pass streams several times that
through the caches); the ratio of the two is why the per-token path avoids needless work even
where it looks cheap (docs/engine.md, "The core in its own process").
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from inferd.engine.core.core_output import CoreOutput, SampleDelta
from inferd.engine.frontend.output_processor import OutputProcessor
from inferd.loader.default_model import default_model_path
from inferd.sampling_params import SamplingParams
from inferd.server.http.sse import encode_event
from inferd.tokenizer import load_tokenizer

TEXT = "The quick brown fox jumps over the lazy dog, then rests under an old oak tree. "


def per_token_us(tokenizer, ids: list[int], requests: int, sweep: np.ndarray | None) -> float:
    """Median over requests of the mean microseconds per token of process + encode."""
    processor = OutputProcessor(tokenizer)
    head = {"id": "cmpl-0", "object": "text_completion", "created": 0, "model": "m"}
    medians = []
    for r in range(requests):
        rid = f"r{r}"
        params = SamplingParams(max_tokens=len(ids), ignore_eos=True)
        processor.add_request(rid, None, ids[:4], params, time.monotonic(), len(ids), True)
        spent = 0.0
        for i, token in enumerate(ids):
            last = i == len(ids) - 1
            out = CoreOutput(rid, [SampleDelta(0, [token], None, "length" if last else None)],
                             time.monotonic(), None, finished=last)  # fmt: skip
            if sweep is not None:
                sweep += 1
            t0 = time.perf_counter()
            (result,), _ = processor.process([out])
            choice = {"index": 0, "text": result.outputs[0].text[-8:], "logprobs": None,
                      "finish_reason": result.outputs[0].finish_reason}  # fmt: skip
            encode_event({**head, "choices": [choice]})
            spent += time.perf_counter() - t0
        medians.append(spent / len(ids) * 1e6)
    return statistics.median(medians)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--requests", type=int, default=16)
    args = parser.parse_args()
    tokenizer = load_tokenizer(default_model_path())
    ids = tokenizer.encode(TEXT * (args.tokens // 8 + 1), add_special_tokens=False)[: args.tokens]
    warm = per_token_us(tokenizer, ids, args.requests, None)
    cold = per_token_us(tokenizer, ids, args.requests, np.ones(64 << 20, dtype=np.uint8))
    print(f"per streamed token: warm {warm:.1f} us, cold {cold:.1f} us ({cold / warm:.1f}x)")


if __name__ == "__main__":
    main()
