"""What crosses the process boundary between the front end and the engine core, as plain data.

    front end ──CoreRequest──▶ core (token ids + SamplingParams or PoolingParams, checked)
    front end ◀──CoreOutput─── core, per step and request with news: new token ids, logprobs
                               (ids and values), finish reasons, the core's timestamps; an
                               embedding request's vector when it finishes

The core never sees text: detokenizing, stop strings and their holdback, logprob token strings,
n > 1 assembly and `RequestOutput`s are the front end's (engine/frontend/output_processor.py). A
stop string the front end finds comes back as a `SampleFinish`, which the core applies before its
next step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inferd.engine.scheduling.step import TokenLogprobs
from inferd.lora_request import LoRARequest
from inferd.multimodal.image_input import ImageInput
from inferd.pooling_params import PoolingParams
from inferd.sampling_params import SamplingParams

if TYPE_CHECKING:
    from inferd.engine.scheduling.request import Request


@dataclass
class CoreRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int  # resolved: params.max_tokens or what the context leaves
    arrival_time: float  # time.monotonic of the front end (one clock for a machine's processes)
    cache_salt: str | None = None
    # An embedding request (resolved: every field set); `params` are then the defaults.
    pooling: PoolingParams | None = None
    lora_request: LoRARequest | None = None  # the adapter it runs under; None: the base model
    priority: int = 0  # lower first, under --scheduling-policy priority (Request.priority)
    # NOTE: last, with a default: the record is also built positionally.
    background: bool = False  # the background lane (Request.background)
    # Its prompt's images, preprocessed (inferd/multimodal/image_input.py); last, with a default.
    images: list[ImageInput] = field(default_factory=list)


@dataclass
class SampleDelta:
    """One sample's news this step."""

    index: int  # which of the request's n samples
    new_token_ids: list[int] = field(default_factory=list)
    new_logprobs: list[TokenLogprobs] | None = None  # one per new token when asked for
    # "stop" (a stop token: the last of `new_token_ids`, never shown as text), "length",
    # "abort", "error", "queue_timeout" (never scheduled within max_queue_time: the server's
    # 503); None while running.
    finish_reason: str | None = None
    stop_reason: int | None = None  # the stop_token_ids entry that ended it


@dataclass
class RequestEvents:
    """The core's side of a request's timeline (time.monotonic seconds)."""

    queued_time: float | None = None
    first_scheduled_time: float | None = None
    num_cached_tokens: int = 0
    preemption_times: tuple[float, ...] = ()


@dataclass
class CoreOutput:
    request_id: str
    samples: list[SampleDelta]
    time: float  # when the core appended the tokens (time.monotonic)
    events: RequestEvents | None  # None: unchanged since the request's previous output
    # Logprobs of the prompt tokens the step's positions predicted (prompt_logprobs), in order.
    new_prompt_logprobs: list[TokenLogprobs] | None = None
    finished: bool = False  # the core is done with the request: every sample ended
    error: str | None = None  # the request failed in the core
    embedding: list[float] | None = None  # an embedding request's result, with `finished`


@dataclass
class SampleFinish:
    """The front end ends one sample (a stop string appeared in its text): the core frees its
    blocks before the next step; tokens it computed meanwhile are dropped by the front end."""

    request_id: str
    index: int


def request_news(req: Request, samples: list[SampleDelta], now: float,
                 prompt_logprobs: list[TokenLogprobs] | None = None) -> CoreOutput:  # fmt: skip
    """The CoreOutput of a request (the scheduler's state) with these news."""
    m = req.metrics
    now_known = (m.queued_time, m.first_scheduled_time, m.num_cached_tokens, m.preemption_times)
    events = None  # most steps: nothing new on the request's timeline
    if now_known != req.sent_events:
        req.sent_events = now_known
        events = RequestEvents(*now_known)
    return CoreOutput(req.request_id, samples, now, events, prompt_logprobs, req.finished,
                      req.error, req.embedding)  # fmt: skip
