"""The model of a step's time on a device: the roofline (roofline.py) over the device's limits,
plus what the roofline leaves out, a fixed cost per step and a cost per token row.

On this machine (`--hardware this`) the limits are measured (machine_peaks.py) and the two
overheads fitted ONCE per machine from inferd's own engine at small sizes (the embedded model:
decode steps of 1 and 2 sequences, prefill chunks of 16 and 64 tokens): each measured step less
its roofline time, fitted as `fixed + per_token x rows` by least squares. The fit is stored
beside the peaks and never adjusted to `inferd plan --check`'s points (batches of 1, 8 and 32,
prefill of 512 tokens), which test it. The per-token cost is work the roofline does not count
(norms, rotary embeddings, activations, residual adds, sampling): it is scaled to another model
by its layers x hidden size.

For a named profile (a GPU, a server socket) nothing can be fitted here: the stated fractions
of the published peaks that a tuned engine reaches (BANDWIDTH_FRACTION, COMPUTE_FRACTION) and a
stated per-step overhead (GPU_FIXED_S, GPU_PER_LAYER_S: launches and the scheduler, with CUDA
graphs) apply to every profile alike.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from inferd.plan.machine_peaks import MachinePeaks, load_cached, store_cached
from inferd.plan.roofline import ModelSlice, StepTime, decode_work, prefill_work, roofline_time

# What a well-tuned engine reaches of a datasheet's peaks (decode kernels stream weights at
# ~80% of HBM bandwidth; large GEMMs run at ~60-70% of dense tensor throughput).
BANDWIDTH_FRACTION = 0.8
COMPUTE_FRACTION = 0.6
GPU_FIXED_S = 300e-6  # a step's scheduling, sampling and launch of its CUDA graph
GPU_PER_LAYER_S = 15e-6  # a layer's kernels' launch gaps and small kernels (norms, rotary)
FIT_MODEL = None  # the embedded model: what the fit runs
FIT_DECODE_BATCHES = (1, 2, 4)
FIT_PREFILL_TOKENS = (16, 64, 128)
FIT_PROMPT = 16
FIT_DECODE_STEPS = 16  # a decode step: the difference of runs of 2 and 2 + this many tokens
FIT_VERSION = 3


@dataclass(frozen=True)
class StepOverhead:
    fixed_s: float = 0.0  # every step
    per_layer_s: float = 0.0  # every step, per decoder layer on the device
    per_token_s: float = 0.0  # per token row, for a model of `reference_size` layers x hidden
    reference_size: int = 1
    source: str = ""
    prefill_s: float = 0.0  # more, for a step that prefills a prompt (its own code path)

    def seconds(self, rows: int, layers: int, layers_x_hidden: int,
                prefill: bool = False) -> float:  # fmt: skip
        scale = layers_x_hidden / max(self.reference_size, 1)
        extra = self.prefill_s if prefill else 0.0
        return self.fixed_s + extra + self.per_layer_s * layers + self.per_token_s * rows * scale


@dataclass(frozen=True)
class StepModel:
    peaks: MachinePeaks
    bandwidth_fraction: float
    compute_fraction: float
    overhead: StepOverhead

    @property
    def bandwidth(self) -> float:
        return self.peaks.memory_bandwidth_bytes_s * self.bandwidth_fraction

    def flops_at(self, weight_format: str, rows: int) -> float:
        return self.peaks.flops_at(weight_format, rows) * self.compute_fraction

    def _overhead(self, m: ModelSlice, rows: int, prefill: bool = False) -> float:
        layers = m.config.num_layers / m.pp
        size = round(layers * m.config.hidden_size)
        return self.overhead.seconds(rows, round(layers), size, prefill)

    def decode(self, m: ModelSlice, batch: int, context: int, comm_s: float = 0.0) -> StepTime:
        work = decode_work(m, batch, context)
        return roofline_time(work, self.bandwidth, self.flops_at,
                             self._overhead(m, batch), comm_s)  # fmt: skip

    def prefill(self, m: ModelSlice, tokens: int, sequences: int = 1, context_before: int = 0,
                decodes: int = 0, decode_context: int = 0,
                comm_s: float = 0.0) -> StepTime:  # fmt: skip
        work = prefill_work(m, tokens, sequences, context_before, decodes, decode_context)
        return roofline_time(work, self.bandwidth, self.flops_at,
                             self._overhead(m, tokens + decodes, True), comm_s)  # fmt: skip


def profile_step_model(peaks: MachinePeaks) -> StepModel:
    why = "stated: 300 us a step + 15 us a layer (no fit on a named device)"
    overhead = StepOverhead(GPU_FIXED_S, GPU_PER_LAYER_S, 0.0, 1, why)
    return StepModel(peaks, BANDWIDTH_FRACTION, COMPUTE_FRACTION, overhead)


def _least_squares(points: list[tuple[float, float]]) -> tuple[float, float]:
    """a, b >= 0 minimising sum (y - a - b x)^2 (a clamped fit: overheads are not negative)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    b = max(b, 0.0)
    a = max(my - b * mx, 0.0)
    return a, b


def timed(fn: Callable[[], object], threads: int, repeats: int = 3) -> float:
    """The fastest of `repeats` runs, each the lesser of its wall-clock time and the process's
    CPU time over `threads` (machine_peaks.py says why: cores shared with other work)."""
    best = float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        best = min(best, min(wall, cpu / threads) if cpu > 0 else wall)
    return best


def measure_fit_points(llm, threads: int) -> list[dict]:
    """Steps of the engine at the fit's sizes: decode steps (the difference of two runs that
    differ only in tokens generated) and prefill chunks (a run of one token)."""
    from inferd.sampling_params import SamplingParams

    def run(batch: int, prompt: int, out: int) -> float:
        prompts = [{"prompt_token_ids": [200 + (7 * i + j) % 4000 for j in range(prompt)]}
                   for i in range(batch)]  # fmt: skip
        params = SamplingParams(max_tokens=out, ignore_eos=True, temperature=0.0)
        return timed(lambda: llm.generate(prompts, params, use_tqdm=False), threads)

    points = []
    for batch in FIT_DECODE_BATCHES:
        short, long = run(batch, FIT_PROMPT, 2), run(batch, FIT_PROMPT, 2 + FIT_DECODE_STEPS)
        points.append({"kind": "decode", "rows": batch,
                       "context": FIT_PROMPT + 2 + FIT_DECODE_STEPS // 2,
                       "seconds": max(long - short, 0.0) / FIT_DECODE_STEPS})  # fmt: skip
    for tokens in FIT_PREFILL_TOKENS:
        points.append({"kind": "prefill", "rows": tokens, "context": 0,
                       "seconds": run(1, tokens, 1)})  # fmt: skip
    return points


def fit_overhead(points: list[dict], m: ModelSlice, peaks: MachinePeaks) -> StepOverhead:
    """Fit the points' time beyond their roofline: `per_token x rows + prefill` on the prefill
    chunks (a line through them), then `fixed` as what the decode steps have beyond their
    per-token share (the mean, clamped at zero)."""
    bare = StepModel(peaks, 1.0, 1.0, StepOverhead())
    decodes, prefills = [], []
    for p in points:
        if p["kind"] == "decode":
            roof = bare.decode(m, p["rows"], p["context"]).time_s
            decodes.append((float(p["rows"]), p["seconds"] - roof))
        else:
            roof = bare.prefill(m, p["rows"]).time_s
            prefills.append((float(p["rows"]), p["seconds"] - roof))
    prefill_fixed, per_token = _least_squares(prefills)
    fixed = max(sum(r - per_token * n for n, r in decodes) / len(decodes), 0.0)
    size = m.config.num_layers * m.config.hidden_size
    why = f"fitted on this machine ({len(points)} steps of the embedded model)"
    return StepOverhead(fixed, 0.0, per_token, size, why, max(prefill_fixed - fixed, 0.0))


def this_machine_step_model(peaks: MachinePeaks, make_llm=None, refresh: bool = False,
                            slice_for=None) -> StepModel:  # fmt: skip
    """The fitted model of this machine: from the cache, else fitted now (needs `make_llm`, the
    engine's constructor, and `slice_for(facts)`, the ModelSlice of a model in the default
    mode; about ten seconds on a quiet machine)."""
    data = None if refresh else load_cached("step_model")
    if data is not None and data.get("version") == FIT_VERSION:
        overhead = StepOverhead(**data["overhead"])
        return StepModel(peaks, 1.0, 1.0, overhead)
    if make_llm is None or slice_for is None:
        raise RuntimeError("this machine's step model is not fitted yet: run `inferd plan`")
    import torch

    from inferd.plan.model_facts import load_model

    facts = load_model(FIT_MODEL)
    llm = make_llm(model=FIT_MODEL, kv_cache_memory=256 << 20)
    points = measure_fit_points(llm, max(torch.get_num_threads(), 1))
    overhead = fit_overhead(points, slice_for(facts), peaks)
    store_cached("step_model", {
        "version": FIT_VERSION, "overhead": dataclasses.asdict(overhead), "points": points,
        "fitted_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    })  # fmt: skip
    return StepModel(peaks, 1.0, 1.0, overhead)
