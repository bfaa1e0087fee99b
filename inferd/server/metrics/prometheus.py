"""Prometheus metrics with vLLM's names under the `inferd:` prefix, so an existing vLLM dashboard
works after replacing `vllm:` with `inferd:`.

Each server owns its registry (never prometheus_client's global one), so two apps in one process
do not collide. Gauges and counters come from `engine.stats()` (counters advance by the delta
since the last snapshot), and so do the step-phase histograms, which the engine fills itself
(step_metrics.py); they carry vLLM's `engine` label: "0", or one series per data-parallel replica
when the client reports each replica's stats (`replica_stats`). The request histograms are
observed from each request's own timestamps: the inter-token latency every time a request's
output grows (token_histogram.py: cheap enough for every token), the rest when it finishes.
The KV tiers' series (kv_tier_metrics.py) join the registry once the stats hold tiers.

The request intervals are vLLM's (RequestMetrics in inferd/outputs.py): queue = queued by the
engine → first scheduled; prefill = first scheduled → first token; decode = first token → last
token; inference = first scheduled → last token; e2e = arrival → finished. So queue + prefill +
decode <= e2e: the gap is the server's own work (parsing, tokenizing) and the final output.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE  # noqa: F401 - re-exported
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from inferd.outputs import RequestMetrics, RequestOutput, finish_reasons
from inferd.server.metrics.disaggregation_metrics import DisaggregationMetrics
from inferd.server.metrics.efficiency_metrics import EfficiencyCollector
from inferd.server.metrics.kv_tier_metrics import KVTierMetrics
from inferd.server.metrics.step_metrics import StepTimingCollector
from inferd.server.metrics.token_histogram import TokenHistogram

PREFIX = "inferd:"
# Buckets in seconds, chosen for this engine's range: sub-millisecond GPU decode steps up to
# minutes-long CPU requests.
_LATENCY = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
)
_REQUEST = (
    0.1,
    0.25,
    0.5,
    1.0,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    45.0,
    60.0,
    90.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
# engine.stats() field → counter name (without the prefix and the _total suffix)
_COUNTERS = {
    "prompt_tokens": "prompt_tokens",
    "generation_tokens": "generation_tokens",
    "num_preemptions": "num_preemptions",
    "num_queue_timeouts": "request_queue_timeouts",
    "prefix_cache_queries": "prefix_cache_queries",
    "prefix_cache_hits": "prefix_cache_hits",
    # Speculative decoding (vLLM's names; zero without --speculative-config)
    "spec_decode_num_drafts": "spec_decode_num_drafts",
    "spec_decode_num_draft_tokens": "spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens": "spec_decode_num_accepted_tokens",
}
_COUNTER_HELP = {
    "prompt_tokens": "Prompt tokens computed (prefix-cache hits excluded, recomputation included).",
    "generation_tokens": "Generated tokens.",
    "num_preemptions": "Sequences preempted for lack of KV blocks (or, under the priority "
    "policy, for a waiting request of a higher priority).",
    "num_queue_timeouts": "Requests dropped unscheduled past --max-queue-time (answered 503).",
    "prefix_cache_queries": "Prompt tokens looked up in the prefix cache.",
    "prefix_cache_hits": "Prompt tokens found in the prefix cache.",
    "spec_decode_num_drafts": "Speculative verifications with at least one draft token.",
    "spec_decode_num_draft_tokens": "Draft tokens verified.",
    "spec_decode_num_accepted_tokens": "Draft tokens accepted.",
}


def token_buckets(max_model_len: int) -> tuple[int, ...]:
    """vLLM's 1-2-5 buckets for token counts: 1, 2, 5, 10, 20, 50, ... up to max_model_len."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_model_len:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


class ServerMetrics:
    def __init__(self, model_name: str, max_model_len: int = 131072,
                 replica_stats: Callable[[], list] | None = None):  # fmt: skip
        """`replica_stats`: each data-parallel replica's stats (the client's), else the one
        engine's stats given to `render` are engine "0"."""
        self.registry = CollectorRegistry()
        reg, label = self.registry, {"model_name": model_name}
        per_engine = ["model_name", "engine"]
        self.replica_stats = replica_stats

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(PREFIX + name, doc, per_engine, registry=reg)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(PREFIX + name, doc, list(label), registry=reg, buckets=buckets).labels(
                **label
            )

        self.running = gauge("num_requests_running", "Sequences in the running batch.")
        self.waiting = gauge("num_requests_waiting", "Sequences waiting to be scheduled.")
        self.kv_usage = gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).")
        self.sleep_state = gauge("engine_sleep_state",
                                 "0 awake, else the level of POST /sleep (1: KV pool freed, "
                                 "2: weights dropped too).")  # fmt: skip
        self.counters = {
            field: Counter(PREFIX + name, _COUNTER_HELP[field], per_engine, registry=reg)
            for field, name in _COUNTERS.items()
        }
        self.accepted_per_pos = Counter(
            PREFIX + "spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens by their position in the draft (0-based).",
            ["model_name", "engine", "position"],
            registry=reg,
        )
        self.success = Counter(
            PREFIX + "request_success",
            "Finished requests by finish reason.",
            ["model_name", "finished_reason"],
            registry=reg,
        )
        self.lora_resident = Gauge(PREFIX + "lora_adapter_resident",
                                   "1 while the LoRA adapter is in a slot, else 0.",
                                   [*per_engine, "lora_name"], registry=reg)  # fmt: skip
        self.lora_requests = Counter(PREFIX + "lora_requests",
                                     "Requests that ran under the LoRA adapter.",
                                     [*per_engine, "lora_name"], registry=reg)  # fmt: skip
        self.per_engine = per_engine
        self.kv_tiers: KVTierMetrics | None = None  # registered once stats hold tiers
        self.disaggregation: DisaggregationMetrics | None = None  # once stats carry a role
        self.model_name = model_name
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token.", _LATENCY)
        self.itl = TokenHistogram(PREFIX + "inter_token_latency_seconds",
                                  "Time between output tokens.", label, _LATENCY)  # fmt: skip
        reg.register(self.itl)
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to finish.", _REQUEST)
        self.queue = histogram(
            "request_queue_time_seconds", "Queued by the engine to first scheduled.", _REQUEST
        )
        self.prefill = histogram(
            "request_prefill_time_seconds", "First scheduled to first token.", _REQUEST
        )
        self.decode = histogram(
            "request_decode_time_seconds", "First token to last token.", _REQUEST
        )
        self.inference = histogram(
            "request_inference_time_seconds", "First scheduled to last token.", _REQUEST
        )
        counts = token_buckets(max_model_len)
        self.prompt_tokens = histogram(
            "request_prompt_tokens", "Prompt tokens of a finished request.", counts
        )
        self.generation_tokens = histogram(
            "request_generation_tokens", "Generated tokens of a finished request.", counts
        )
        self.max_tokens = histogram(
            "request_params_max_tokens", "The max_tokens request parameter, when given.", counts
        )
        self.steps = StepTimingCollector(PREFIX, model_name)
        reg.register(self.steps)
        self.efficiency = EfficiencyCollector(PREFIX, model_name)  # MBU / MFU per step
        reg.register(self.efficiency)
        self._last_counts: dict[tuple[str, str], int] = {}
        # request id → (tokens generated, time of the last one) at its previous output
        self._progress: dict[str, tuple[int, float]] = {}

    def update_stats(self, stats) -> None:
        """The engine's stats (all replicas' when the client reports them one by one)."""
        replicas = self.replica_stats() if self.replica_stats is not None else [stats]
        self.steps.timings = [getattr(s, "step_timing", None) for s in replicas]
        self.efficiency.records = [getattr(s, "step_efficiency", None) for s in replicas]
        for engine, s in enumerate(replicas):
            self._update_engine(str(engine), s)

    def _update_engine(self, engine: str, stats) -> None:
        labels = {"model_name": self.model_name, "engine": engine}
        self.running.labels(**labels).set(stats.num_running)
        self.waiting.labels(**labels).set(stats.num_waiting)
        self.kv_usage.labels(**labels).set(stats.kv_cache_usage)
        self.sleep_state.labels(**labels).set(getattr(stats, "sleep_level", 0))
        for field, counter in self.counters.items():
            self._advance(counter.labels(**labels), (engine, field), getattr(stats, field))
        for pos, value in enumerate(stats.spec_decode_num_accepted_tokens_per_pos):
            counter = self.accepted_per_pos.labels(**labels, position=str(pos))
            self._advance(counter, (engine, f"spec_decode_pos{pos}"), value)
        resident = set(getattr(stats, "lora_resident", ()))
        for name, count in getattr(stats, "lora_requests", {}).items():
            self.lora_resident.labels(**labels, lora_name=name).set(int(name in resident))
            counter = self.lora_requests.labels(**labels, lora_name=name)
            self._advance(counter, (engine, f"lora:{name}"), count)
        if getattr(stats, "kv_tiers", ()):
            if self.kv_tiers is None:
                self.kv_tiers = KVTierMetrics(PREFIX, self.registry, self.per_engine)
            self.kv_tiers.update(labels, stats, self._advance)
        if getattr(stats, "engine_role", ""):  # disaggregated serving: prefill or decode
            if self.disaggregation is None:
                self.disaggregation = DisaggregationMetrics(PREFIX, self.registry,
                                                            self.per_engine)  # fmt: skip
            self.disaggregation.update(labels, stats, self._advance)

    def _advance(self, counter, key: tuple[str, str], value: float) -> None:
        """Counters advance by what the engine's cumulative count grew since the last look."""
        delta = value - self._last_counts.get(key, 0)
        if delta > 0:
            counter.inc(delta)
        self._last_counts[key] = value

    def observe_output(self, out: RequestOutput) -> None:
        """Called for every engine output, in order, on the event loop."""
        m = out.metrics
        if m is None:
            return
        self._observe_itl(out, m)
        if out.finished:
            self._progress.pop(out.request_id, None)
            self._observe_finished(out, m)

    def _observe_itl(self, out: RequestOutput, m: RequestMetrics) -> None:
        if m.last_token_time is None:
            return
        # The longest sample grows by one token per step whatever n is, so its length counts
        # the gaps a streaming client sees.
        longest = max((len(c.token_ids) for c in out.outputs), default=0)
        count, last = self._progress.get(out.request_id, (0, 0.0))
        length = count + longest if out.delta else longest  # a delta holds the new tokens only
        new = length - count
        if count and new > 0:
            self.itl.observe((m.last_token_time - last) / new, new)
        if new > 0 or not count:
            self._progress[out.request_id] = (length, m.last_token_time)

    def _observe_finished(self, out: RequestOutput, m: RequestMetrics) -> None:
        for finish_reason in finish_reasons(out):
            reason = finish_reason or ("error" if out.error else "abort")
            self.success.labels(model_name=self.model_name, finished_reason=reason).inc()
        if m.first_token_time is not None:
            self.ttft.observe(m.first_token_time - m.arrival_time)
        intervals = ((self.e2e, m.e2e_latency), (self.queue, m.queue_time),
                     (self.prefill, m.prefill_time), (self.decode, m.decode_time),
                     (self.inference, m.inference_time))  # fmt: skip
        for histogram, seconds in intervals:
            if seconds is not None:
                histogram.observe(seconds)
        self.prompt_tokens.observe(len(out.prompt_token_ids))
        self.generation_tokens.observe(m.num_generation_tokens)
        if m.max_tokens_param is not None:
            self.max_tokens.observe(m.max_tokens_param)

    def render(self, stats=None) -> bytes:
        if stats is not None:
            self.update_stats(stats)
        return generate_latest(self.registry)
