"""What generation returns, with vLLM's names: `RequestOutput` holding one `CompletionOutput` per
sample, and per-request timing metrics; what an embedding request returns,
`EmbeddingRequestOutput`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Logprob:
    """Log-probability of one token under the model's raw (unpenalised, T=1) distribution."""

    logprob: float
    rank: int  # 1 = the most likely token
    decoded_token: str | None = None


# One generated (or prompt) position: token id → Logprob, holding the chosen token and the
# top alternatives that were asked for.
PositionLogprobs = dict[int, Logprob]


@dataclass
class RequestMetrics:
    """Timestamps (time.monotonic seconds, one process's clock) of a request's life: its
    timeline, and the intervals vLLM's request metrics are made of (queue, prefill, decode,
    inference, end to end)."""

    arrival_time: float  # the server (or offline API) received it
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    num_generation_tokens: int = 0
    num_preemptions: int = 0
    queued_time: float | None = None  # the engine accepted it into the scheduler's queue
    # When a sequence of the request was preempted. NOTE: a tuple, replaced on each change,
    # so a shallow copy of these metrics (the server's snapshot) never changes under a reader.
    preemption_times: tuple[float, ...] = ()
    max_tokens_param: int | None = None  # max_tokens as the request gave it (None: not given)

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def queue_time(self) -> float | None:
        """vLLM's queue interval: queued (else arrival) → first scheduled."""
        if self.first_scheduled_time is None:
            return None
        start = self.queued_time if self.queued_time is not None else self.arrival_time
        return self.first_scheduled_time - start

    @property
    def prefill_time(self) -> float | None:
        """First scheduled → first token."""
        return _span(self.first_scheduled_time, self.first_token_time)

    @property
    def decode_time(self) -> float | None:
        """First token → last token."""
        return _span(self.first_token_time, self.last_token_time)

    @property
    def inference_time(self) -> float | None:
        """First scheduled → last token: running, preemptions included."""
        return _span(self.first_scheduled_time, self.last_token_time)

    @property
    def e2e_latency(self) -> float | None:
        if self.finished_time is None:
            return None
        return self.finished_time - self.arrival_time

    def snapshot(self) -> RequestMetrics:
        """A copy that later changes to these metrics do not reach. NOTE: not copy.copy, whose
        generic path (reduce, reconstruct) runs for every streamed token and costs tens of
        microseconds when a forward pass has just evicted the caches."""
        copied = object.__new__(RequestMetrics)
        copied.__dict__.update(self.__dict__)
        return copied

    def timeline(self) -> list[tuple[str, float]]:
        """The request's events in order, as (event, seconds since arrival): arrived, queued,
        scheduled, first_token, preempted (each time), finished."""
        events = [
            ("arrived", self.arrival_time),
            ("queued", self.queued_time),
            ("scheduled", self.first_scheduled_time),
            ("first_token", self.first_token_time),
            *(("preempted", t) for t in self.preemption_times),
            ("finished", self.finished_time),
        ]
        timed = [(name, t - self.arrival_time) for name, t in events if t is not None]
        return sorted(timed, key=lambda e: e[1])


def _span(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None  # "stop", "length", "abort", or None while running
    stop_reason: int | str | None = None  # the stop string or token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    error: str | None = None  # set when the request failed inside the engine
    # Only what is new since the request's previous output (RequestOutputKind.DELTA): each
    # sample's new text, token ids and logprobs, and its finish once; the prompt fields whole.
    delta: bool = False


@dataclass
class EmbeddingOutput:
    embedding: list[float]  # empty when the request ended without one (aborted, failed)


@dataclass
class EmbeddingRequestOutput:
    """What an embedding request returns (vLLM's names: `.outputs.embedding`); only once, when
    it finished."""

    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool = True
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    error: str | None = None  # set when the request failed inside the engine
    prompt: str | None = None


def finish_reasons(out: RequestOutput | EmbeddingRequestOutput) -> list[str | None]:
    """Each sample's finish reason; an embedding request's one: "stop" once it has its vector
    (None: it ended without one, aborted or failed)."""
    if isinstance(out, EmbeddingRequestOutput):
        return ["stop" if out.outputs.embedding else None]
    return [c.finish_reason for c in out.outputs]
