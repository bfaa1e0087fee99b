"""From a configuration's step times to what a user sees: TTFT, TPOT (mean and p99),
throughput, the largest concurrency that meets the SLOs, power, energy and cost.

The serving model is continuous batching with chunked prefill (inferd's scheduler, vLLM's):
every step decodes one token of each running sequence and prefills up to the step's token
budget of waiting prompts beside them.

- TTFT: a new prompt is prefilled in chunks of at most the budget, each chunk a step beside
  the other running sequences' decodes (the steady state; a burst of arrivals queues more).
- TPOT mean: a step decoding every running sequence plus the average prefill a step carries
  (each request brings `prompt` tokens per `output` steps it runs).
- TPOT p99: a step that also carries a whole prefill chunk (arrivals make such steps more than
  1% of them at any concurrency above output/100).
- Throughput: running sequences x replicas / TPOT mean.
- Pipeline parallelism: micro-batches of concurrency / PP run through the stages; a token waits
  for every stage (TPOT = PP x a stage's step), each stage holds 1/PP of the layers.
- Tensor parallelism: two all-reduces a layer of the step's rows x hidden activations over the
  interconnect (interconnects.py), added to the step.
- An arrival rate instead of a concurrency: Little's law, concurrency = rate x request time,
  solved by iteration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferd.plan.candidates import Candidate
from inferd.plan.interconnects import Interconnect, all_reduce_seconds, point_to_point_seconds
from inferd.plan.roofline import StepTime
from inferd.plan.step_model import StepModel


@dataclass(frozen=True)
class Workload:
    prompt_len: int
    output_len: int
    concurrency: int | None = None
    rate: float | None = None  # requests per second (instead of a concurrency)
    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    max_num_batched_tokens: int = 8192

    @property
    def context(self) -> int:
        return self.prompt_len + self.output_len


@dataclass(frozen=True)
class Operating:
    """One configuration at one concurrency (per replica)."""

    concurrency: int  # running sequences per replica
    ttft_s: float
    tpot_s: float  # mean
    tpot_p99_s: float
    output_tok_s: float  # all replicas
    decode: StepTime  # a pure decode step of the running sequences (one stage)
    prefill: StepTime  # a prefill chunk (with the decodes beside it)
    all_reduce_s: float  # per decode step

    def meets(self, w: Workload) -> bool:
        return ((w.ttft_p99_s is None or self.ttft_s <= w.ttft_p99_s)
                and (w.tpot_p99_s is None or self.tpot_p99_s <= w.tpot_p99_s))  # fmt: skip


def activation_bytes(rows: int, hidden: int, device_kind: str) -> int:
    return rows * hidden * (4 if device_kind == "cpu" else 2)


def all_reduce_s(c: Candidate, rows: int, link: Interconnect, device_kind: str) -> float:
    """Tensor-parallel all-reduces of one step of `rows` rows on one stage: two a layer."""
    config = c.slice.config
    nbytes = activation_bytes(rows, config.hidden_size, device_kind)
    return 2 * config.num_layers / c.layout.pp * all_reduce_seconds(nbytes, c.layout.tp, link)


def communication_s(c: Candidate, rows: int, link: Interconnect, device_kind: str) -> float:
    """All-reduces of one step on one stage, and its send to the next pipeline stage."""
    nbytes = activation_bytes(rows, c.slice.config.hidden_size, device_kind)
    send = point_to_point_seconds(nbytes, link) if c.layout.pp > 1 else 0.0
    return all_reduce_s(c, rows, link, device_kind) + send


def operate(c: Candidate, model: StepModel, w: Workload, concurrency: int, link: Interconnect,
            device_kind: str) -> Operating:  # fmt: skip
    """`c` running `concurrency` sequences per replica in the steady state."""
    pp = c.layout.pp
    micro = max(math.ceil(concurrency / pp), 1)  # sequences per micro-batch and stage step
    mid = w.prompt_len + w.output_len // 2  # the average running context
    budget = max(w.max_num_batched_tokens - micro, 1)
    chunk = min(w.prompt_len, budget)

    def step(tokens: float, decodes: int, sequences: int = 1) -> StepTime:
        tokens = int(round(tokens))
        rows = max(tokens + decodes, 1)
        comm = communication_s(c, rows, link, device_kind)
        if tokens <= 0:
            return model.decode(c.slice, max(decodes, 1), mid, comm)
        return model.prefill(c.slice, tokens, sequences, 0, decodes, mid, comm)

    decode = step(0, micro)
    # the average prefill a step carries: each request's prompt over the steps it decodes
    carried = min(micro * w.prompt_len / max(w.output_len, 1), budget)
    mean = step(carried, micro, max(1, round(carried / max(w.prompt_len, 1))))
    with_chunk = step(chunk, micro)
    chunks = math.ceil(w.prompt_len / budget)
    first = step(chunk, max(micro - 1, 0))
    ttft = chunks * first.time_s * pp
    tpot, tpot_p99 = mean.time_s * pp, with_chunk.time_s * pp
    throughput = concurrency * c.layout.dp / tpot if tpot > 0 else 0.0
    return Operating(concurrency, ttft, tpot, tpot_p99, throughput, decode, first,
                     all_reduce_s(c, micro, link, device_kind))  # fmt: skip


def largest_meeting(c: Candidate, model: StepModel, w: Workload, link: Interconnect,
                    device_kind: str) -> Operating | None:  # fmt: skip
    """The largest concurrency per replica (within memory) meeting the SLOs; None: not even
    one sequence does."""
    top = c.max_concurrency
    if top < 1:
        return None

    def at(n: int) -> Operating:
        return operate(c, model, w, n, link, device_kind)

    if not at(1).meets(w):
        return None
    lo, hi = 1, top
    while lo < hi:  # latencies grow with concurrency: bisect on meeting the SLOs
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if at(mid).meets(w) else (lo, mid - 1)
    return at(lo)


def concurrency_for_rate(c: Candidate, model: StepModel, w: Workload, link: Interconnect,
                         device_kind: str) -> tuple[int, bool]:  # fmt: skip
    """Concurrency per replica that an arrival rate sustains (Little's law), and whether the
    configuration keeps up with the rate at all within memory."""
    assert w.rate is not None
    per_replica = w.rate / c.layout.dp
    n = 1
    for _ in range(60):
        op = operate(c, model, w, n, link, device_kind)
        request_s = op.ttft_s + max(w.output_len - 1, 0) * op.tpot_s
        need = max(math.ceil(per_replica * request_s), 1)
        if need == n:
            return n, n <= max(c.max_concurrency, 1)
        if need > max(c.max_concurrency, 1):
            return c.max_concurrency, False
        n = need
    return n, n <= c.max_concurrency


@dataclass(frozen=True)
class Economics:
    power_w: float
    tokens_per_joule: float
    cost_per_million_tokens: float | None
    heat_btu_h: float


def economics(op: Operating, devices: int, tdp_w: float,
              price_per_device_hour: float | None) -> Economics:  # fmt: skip
    """Every device at its stated TDP while it serves (the ceiling: a decode-bound GPU draws
    less); the heat to remove is the same power."""
    power = tdp_w * devices
    per_joule = op.output_tok_s / power if power else 0.0
    cost = None
    if price_per_device_hour is not None and op.output_tok_s > 0:
        cost = price_per_device_hour * devices / 3600 / op.output_tok_s * 1e6
    return Economics(power, per_joule, cost, power * 3.412)
