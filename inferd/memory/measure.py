"""Measured memory (`inferd memory --measure`): load the model with the engine, run a generation,
and read what the process holds (CPU: resident set size from /proc) or what the CUDA caching
allocator holds (GPU: allocated, reserved, peak), next to the estimate's predictions. The caller
hands in the engine's offline API (`inferd.LLM`): memory accounting sits below the engine, which
itself sizes its KV pool with this package.

Measurements and predictions differ for reasons worth seeing, so each row says why: RSS counts
touched pages (including pages of the memory-mapped checkpoint), glibc keeps freed memory for
reuse, the CUDA allocator caches freed blocks (reserved ≥ allocated) and rounds them up, and the
CUDA context lives outside the allocator altogether. The snapshots themselves: snapshot.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from inferd.config import ModelConfig
from inferd.memory.activations import estimate_activations
from inferd.memory.estimate import ELEMENT_BYTES, MemoryEstimate, compute_dtype
from inferd.memory.snapshot import (
    DeviceStats,
    Snapshot,
    peak_snapshot,
    proc_status,
    reset_peak_rss,
    take_snapshot,
)
from inferd.sampling_params import SamplingParams

_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_KV_DTYPES = {**_TORCH_DTYPES, "int8": "int8"}  # int8: rows with their scales (kv_int8.py)
_PROMPT = "Request {i}: explain in a few sentences why the KV cache grows with the context."


def local_device_memory(device: str) -> int:
    """Total memory of this machine's device: RAM on CPU, the first GPU's memory on CUDA."""
    if device == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass
class Measurement:
    device: str
    snapshots: list[Snapshot]
    prompt_tokens: int
    generated_tokens: int
    # (what, predicted bytes or None, measured bytes or None, why they differ)
    rows: list[tuple[str, int | None, int | None, str]] = field(default_factory=list)
    peak: Snapshot | None = None  # the peaks during generation (peak RSS; CUDA peak allocated)


class OfflineLLM(Protocol):
    """What measuring needs of the engine's offline API (`inferd.LLM` has it)."""

    def generate(
        self, prompts: list[str], params: SamplingParams, use_tqdm: bool = True
    ) -> list: ...

    def rank_reports(self) -> list[dict]:
        """Per tensor-parallel rank: rank, pid, weight_bytes, kv_cache_bytes ([] without TP)."""
        ...

    def shutdown(self) -> None: ...


def measure_memory(
    model: str | None,
    config: ModelConfig,
    estimate: MemoryEstimate,
    max_tokens: int = 16,
    *,
    make_llm: Callable[..., OfflineLLM],
    device_stats: DeviceStats | None = None,
) -> Measurement:
    """Load `model` with the engine (`make_llm(**engine arguments)`) sized as `estimate` says,
    generate `max_tokens` tokens for each of `estimate.concurrency` prompts, and compare memory
    with the predictions. `device_stats`: where CUDA figures come from (torch.cuda)."""
    tp = estimate.tensor_parallel_size
    if tp != 1 and estimate.device != "cpu":
        raise ValueError("--measure with --tensor-parallel-size runs on CPU ranks only")
    if estimate.dtype not in _TORCH_DTYPES:
        raise ValueError(
            f"--measure loads real weights: --dtype {estimate.dtype} is a what-if precision; "
            "use float32, bfloat16 or float16"
        )
    if estimate.kv_cache_dtype not in _KV_DTYPES:
        raise ValueError(
            f"--measure compares the KV pool of a float32, bfloat16, float16 or int8 cache, not "
            f"{estimate.kv_cache_dtype}"
        )
    dev, pred = estimate.device, estimate.per_device
    blocks = estimate.weight_plan is not None and estimate.weight_plan.blocks
    kwargs: dict[str, Any] = dict(
        model=model,
        dtype="auto" if blocks else _TORCH_DTYPES[estimate.dtype],  # the default keeps blocks
        max_model_len=estimate.max_model_len,
        kv_cache_memory=pred.kv_cache,
        device=dev,
        max_num_seqs=estimate.concurrency,
        max_num_batched_tokens=estimate.max_num_batched_tokens,
        kv_cache_dtype=_KV_DTYPES[estimate.kv_cache_dtype],
    )
    if tp != 1:
        kwargs["tensor_parallel_size"] = tp

    # NOTE: the converted-weights cache maps weights from a file (RssFile, touched lazily);
    # measuring loads them into anonymous memory, where the accounting below expects them.
    saved = os.environ.get("INFERD_WEIGHT_CACHE")
    os.environ["INFERD_WEIGHT_CACHE"] = "0"
    if dev == "cuda" and device_stats is None:
        import torch

        device_stats = torch.cuda
    before = take_snapshot("before load", dev, device_stats)
    try:
        llm = make_llm(**kwargs)
    finally:
        if saved is None:
            del os.environ["INFERD_WEIGHT_CACHE"]
        else:
            os.environ["INFERD_WEIGHT_CACHE"] = saved
    loaded = take_snapshot("after load", dev, device_stats)
    reset_peak_rss()
    if device_stats is not None:
        device_stats.reset_peak_memory_stats()
    prompts = [_PROMPT.format(i=i) for i in range(estimate.concurrency)]
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outputs = llm.generate(prompts, sampling, use_tqdm=False)
    done = take_snapshot("after generation", dev, device_stats)
    reports = llm.rank_reports()
    kv_held = getattr(llm, "kv_cache_bytes", None)

    prompt_lens = [len(o.prompt_token_ids) for o in outputs]
    generated = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    # This run's activations: all prompts in one step when the budget allows, at the context
    # the longest request reached.
    run_acts = estimate_activations(
        config,
        num_tokens=min(sum(prompt_lens), estimate.max_num_batched_tokens),
        num_seqs=len(prompts),
        context_len=max(prompt_lens) + max_tokens,
        act_bytes=ELEMENT_BYTES[compute_dtype(estimate.dtype)],
        attention_backend=estimate.attention_backend,
    ).peak_bytes
    m = Measurement(dev, [before, loaded, done], sum(prompt_lens), generated,
                    peak=peak_snapshot(done))  # fmt: skip
    load_pred = pred.weights + pred.kv_cache
    if dev == "cuda":
        _gpu_rows(m, before, loaded, done, load_pred, run_acts, pred.overhead.bytes)
    else:
        # The loader dequantises one tensor at a time into float32, then converts it to the
        # model dtype; the embedding is the largest tensor of every supported architecture.
        convert = 0 if estimate.dtype == "fp32" else ELEMENT_BYTES[estimate.dtype]
        buffer = config.vocab_size * config.hidden_size * (4 + convert)
        _cpu_rows(m, before, loaded, done, load_pred, run_acts, pred.overhead.bytes, buffer)
    if kv_held is not None and not reports:
        m.rows.append(("KV pool (allocated by the engine)", pred.kv_cache, kv_held(),
                       "the pool the engine sized from the estimate: whole blocks per layer "
                       "group; on CPU its pages count in RSS only once written"))  # fmt: skip
    _rank_rows(m, reports, pred)
    if reports:
        llm.shutdown()
    return m


def _rank_rows(m: Measurement, reports: list[dict], pred) -> None:
    """Under tensor parallelism: what each rank's process holds, measured on that rank."""
    for r in reports:
        rank = r["rank"]
        m.rows += [
            (f"rank {rank}: weights held", pred.weights, r["weight_bytes"],
             "parameters and buffers of this rank's shard: its q heads, MLP slice and "
             "vocabulary rows; norms (and KV heads, when fewer than ranks) replicated"),
            (f"rank {rank}: KV pool", pred.kv_cache, r["kv_cache_bytes"],
             "the same blocks on every rank, each for its own KV heads"),
            (f"rank {rank}: process RSS", pred.total, proc_status(r["pid"]).get("VmRSS"),
             "the whole process: runtime, weights, the KV pages written so far, heap"),
        ]  # fmt: skip


def _delta(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a - b


def _cpu_rows(m, before, loaded, done, load_pred, run_acts, overhead, buffer) -> None:
    held = (
        f"glibc keeps the freed load buffers of the largest tensor (float32 and converted: "
        f"{_mib(buffer)}, plus its raw bytes) in the heap for reuse, as inferd asks it to; "
        "the tokenizer counts too; KV pages count only once written (the pool is allocated "
        "uninitialised)"
    )
    m.rows += [
        ("runtime (RSS before load)", overhead, before.rss,
         "Python, torch and inferd's imports: the estimate's runtime term"),
        ("load: weights + KV pool (anonymous RSS)", load_pred,
         _delta(loaded.rss_anon, before.rss_anon), held),
        ("load: RSS growth", load_pred, _delta(loaded.rss, before.rss),
         "adds the pages of the memory-mapped checkpoint read during load (RssFile: file "
         "cache, reclaimable, not an allocation)"),
        ("load peak over RSS before load", load_pred + buffer,
         _delta(loaded.rss_peak, before.rss),
         "weights + KV pool + the load buffers of the largest tensor, plus its raw bytes and "
         "the tokenizer loading alongside"),
        ("generation: activations of this run", run_acts, _delta(done.rss_peak, loaded.rss),
         "peak RSS during generation over RSS after load: this short run's temporaries, far "
         "below the estimate's worst case (full token budget at full context)"),
    ]  # fmt: skip
    if done.heap_in_use is not None:  # glibc: the allocator PyTorch's CPU tensors come from
        m.rows += [
            ("load: heap in use (malloc)", load_pred,
             _delta(loaded.heap_in_use, before.heap_in_use),
             "what malloc handed out and still lends: weights, the whole KV pool (allocated, "
             "written or not), the tokenizer"),
            ("allocator cache (heap held − in use)", None,
             _delta(done.heap_held, done.heap_in_use),
             "freed blocks glibc keeps for reuse (load buffers, step temporaries): the CPU "
             "side of CUDA's reserved − allocated"),
        ]  # fmt: skip


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def _gpu_rows(m, before, loaded, done, load_pred, run_acts, overhead) -> None:
    m.rows += [
        ("load: weights + KV pool (allocated)", load_pred,
         _delta(loaded.cuda_allocated, before.cuda_allocated),
         "tensors the engine created; allocations round up to 512-byte blocks"),
        ("generation: activations (peak − allocated)", run_acts,
         _delta(done.cuda_peak, loaded.cuda_allocated),
         "the largest step's temporaries on top of the weights and the KV pool"),
        ("allocator cache (reserved − allocated)", None,
         _delta(done.cuda_reserved, done.cuda_allocated),
         "the caching allocator keeps freed blocks for reuse, and fragmentation strands some"),
        ("CUDA context (device used − reserved)", overhead,
         _delta(done.cuda_device_used, done.cuda_reserved),
         "driver state, kernels, library workspaces: outside torch's allocator (also counts "
         "other processes on the device)"),
    ]  # fmt: skip
