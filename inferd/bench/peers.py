"""The peers inferd is measured against, on the same GGUF file and the same requests:

- llama.cpp through `llama-cpp-python`: what a CPU user would otherwise pick. Its Python API
  serves one sequence at a time, so requests run one after another.
- HF transformers, dequantising the GGUF (`from_pretrained(folder, gguf_file=name)`) or loading
  the same HF folder inferd runs, on inferd's device: static batching, the baseline continuous
  batching improves on.

Both decode greedily and ignore EOS, producing exactly each request's output length. Both are
optional (the `bench` extra); a missing one raises `PeerUnavailable` with the install line.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from inferd.bench.metrics import RequestTiming
from inferd.bench.peer_unavailable import PeerUnavailable
from inferd.bench.workload import BenchRequest

PEER_NAMES = {
    "llamacpp": "llamacpp",
    "llama.cpp": "llamacpp",
    "llama_cpp": "llamacpp",
    # llama.cpp's benchmark program: the engine without the bindings (llama_bench.py)
    "llama-bench": "llama-bench",
    "llamabench": "llama-bench",
    "hf": "hf",
    "transformers": "hf",
    # inferd itself without --speculative-config (the speculative decoding speed-up in one run)
    "nospec": "nospec",
}


def parse_peers(text: str | None) -> list[str]:
    """`llamacpp,hf` → ["llamacpp", "hf"]; unknown names are the user's error."""
    if not text:
        return []
    names = []
    for part in (p.strip().lower() for p in text.split(",")):
        if not part:
            continue
        if part not in PEER_NAMES:
            raise ValueError(f"--compare accepts llamacpp, llama-bench, hf and nospec, got "
                             f"{part!r}")  # fmt: skip
        if PEER_NAMES[part] not in names:
            names.append(PEER_NAMES[part])
    return names


def load_peer(name: str, model_path: str, *, n_ctx: int, dtype: str, threads: int | None,
              device: str = "cpu", llama_bench: str | None = None):  # fmt: skip
    gguf = str(model_path).endswith(".gguf")
    if name == "llama-bench":
        if not gguf:
            raise PeerUnavailable(f"llama-bench peer skipped: it runs GGUF files, and "
                                  f"{model_path} is not one")  # fmt: skip
        from inferd.bench.llama_bench import LlamaBenchSystem

        return LlamaBenchSystem(model_path, threads=threads, program=llama_bench)
    if name == "llamacpp":
        if not gguf:
            raise PeerUnavailable(f"llama.cpp peer skipped: it runs GGUF files, and {model_path} "
                                  "is not one")  # fmt: skip
        return LlamaCppSystem(model_path, n_ctx=n_ctx, threads=threads)
    if name == "hf":
        if not gguf and not (Path(model_path) / "config.json").is_file():
            raise PeerUnavailable(f"HF peer skipped: it loads a GGUF file or an HF folder, and "
                                  f"{model_path} is neither")  # fmt: skip
        return HFSystem(model_path, dtype=dtype, device=device)
    raise ValueError(f"unknown peer {name!r}")


class LlamaCppSystem:
    name = "llama.cpp"

    def __init__(self, model_path: str, *, n_ctx: int, threads: int | None = None) -> None:
        try:
            import llama_cpp
        except ImportError as e:
            raise PeerUnavailable(
                f"llama.cpp peer skipped: llama-cpp-python does not import ({e}; pip install "
                "'inferd[bench]', or pip install llama-cpp-python; it compiles llama.cpp, "
                "minutes on 2 cores)"
            ) from e
        threads = threads or os.cpu_count() or 1
        t0 = time.perf_counter()
        self.llm = llama_cpp.Llama(
            model_path=str(model_path),
            n_ctx=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            seed=0,
            verbose=False,
        )
        self.load_seconds = time.perf_counter() - t0
        self.info = {
            "version": llama_cpp.__version__,
            "threads": str(threads),
            "batching": f"none: one request after another, n_ctx={n_ctx}, "
            f"n_batch={self.llm.n_batch}",
        }

    def generate(self, requests: Sequence[BenchRequest]) -> list[RequestTiming]:
        # NOTE: every request of the group is handed over now, as to inferd, so a request's
        # TTFT and E2EL include its wait behind the earlier ones, as they would in a server.
        submitted = time.perf_counter()
        return [self._one(r, submitted) for r in requests]

    def _one(self, r: BenchRequest, start: float) -> RequestTiming:
        # reset() empties the token history, so `generate` cannot reuse a cached prefix of the
        # previous request and evaluates the whole prompt (eval clears the KV cache).
        self.llm.reset()
        first = None
        # temp=0 is llama.cpp's greedy sampler. The generator never stops by itself (no EOS
        # check at this level), so taking output_len tokens is "ignore EOS", exactly.
        tokens = self.llm.generate(r.prompt_token_ids, temp=0.0, repeat_penalty=1.0, reset=True)
        n = 0
        try:
            for _ in tokens:
                n += 1
                if first is None:
                    first = time.perf_counter()
                if n == r.output_len:
                    break
        finally:
            tokens.close()
        end = time.perf_counter()
        return RequestTiming(start, first, end, r.prompt_len, n)

    def close(self) -> None:
        self.llm.close()
        self.llm = None


def _step_clock():
    """A transformers streamer that only records when each decoding step's tokens appear."""
    from transformers.generation.streamers import BaseStreamer

    class StepClock(BaseStreamer):
        def __init__(self) -> None:
            self.times: list[float] = []
            self._prompt_seen = False

        def put(self, value) -> None:
            if not self._prompt_seen:  # generate() first hands the streamer the prompt
                self._prompt_seen = True
                return
            self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    return StepClock()


class HFSystem:
    """One `generate` call per group: the prompts left-padded into one batch.

    A static batch generates the same number of tokens for every row, so the batch runs to the
    longest output length and each request is timed at the step that produced its own last
    token; throughput counts only each request's own tokens. That is how a static-batching
    server would serve the group (finished rows keep occupying the batch), which is the
    comparison that matters, rather than regrouping requests by length."""

    name = "hf"

    def __init__(self, model_path: str, *, dtype: str, device: str = "cpu") -> None:
        try:
            import gguf  # noqa: F401  (transformers needs it to read GGUF)
            import torch
            import transformers
            from transformers import AutoModelForCausalLM
        except ImportError as e:
            raise PeerUnavailable(
                "HF transformers peer skipped: transformers, gguf and accelerate are needed "
                f"(pip install 'inferd[bench]'): {e}"
            ) from e
        transformers.logging.set_verbosity_error()
        self.torch = torch
        path = Path(model_path)
        t0 = time.perf_counter()
        # NOTE: no tokenizer is loaded (converting it costs ~15 s): prompts are token ids.
        if path.suffix == ".gguf":
            model = AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=getattr(torch, dtype)
            )
        else:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.load_seconds = time.perf_counter() - t0
        pad = model.config.pad_token_id
        self.pad_id = 0 if pad is None else int(pad)
        self.info = {
            "version": transformers.__version__,
            "dtype": dtype,
            "device": str(self.device),
            "threads": str(torch.get_num_threads()),
            "batching": "static: one left-padded batch, run to the longest output",
        }

    def generate(self, requests: Sequence[BenchRequest]) -> list[RequestTiming]:
        torch = self.torch
        width = max(r.prompt_len for r in requests)
        steps = max(r.output_len for r in requests)
        ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for i, r in enumerate(requests):
            ids[i, width - r.prompt_len :] = torch.tensor(r.prompt_token_ids)
            mask[i, width - r.prompt_len :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        clock = _step_clock()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the copies above are not the batch's time
        start = time.perf_counter()
        with torch.inference_mode():
            # min_new_tokens masks EOS until the end, so every row makes exactly `steps` tokens.
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=steps,
                min_new_tokens=steps,
                do_sample=False,
                pad_token_id=self.pad_id,
                streamer=clock,
            )
        made = out.shape[1] - width
        if made != steps or len(clock.times) != steps:
            raise RuntimeError(f"HF generated {made} tokens per row, {steps} were asked for")
        t = clock.times
        return [
            RequestTiming(start, t[0], t[r.output_len - 1], r.prompt_len, r.output_len)
            for r in requests
        ]

    def close(self) -> None:
        self.model = None
