"""The front end's last stage: from the core's per-step news (`CoreOutput`: new token ids,
logprobs, finish reasons) to the `RequestOutput`s callers see.

    CoreOutput ──▶ per sample: incremental detokenization, stop strings and their holdback,
                   logprob token strings; per request: n > 1 assembly, metrics ──▶ RequestOutput
               (an embedding request: its vector, once, ──▶ EmbeddingRequestOutput)
               └─▶ SampleFinish for each sample a stop string ended (the core frees it)

A streaming request whose SamplingParams ask for `RequestOutputKind.DELTA` (every server stream)
gets only what is new in each output: the samples with news, each with its new text (what the
holdback releases), token ids and logprobs, and its finish once; the last output lists every
sample with its finish. The cost of an output is then that of its news, not of the length so
far. Otherwise outputs are cumulative (the whole so far: `LLM.generate`, non-stream replies).

Stop strings can straddle token boundaries, so they are searched in the detokenized text, not in
token ids: after each token only the tail that could hold a new match is scanned. While a sample
runs, the last `longest stop string - 1` characters are held back from streaming, since they may
still turn out to begin a stop string that must not appear. A stop string ends the sample here at
once (the tokens after it are never shown); the core hears of it (`SampleFinish`) and stops it
before its next step, so it may have computed a token or two more, which are dropped.

This runs wherever the front end runs: on the caller's thread in-process (`LLMEngine`), on the
server's event loop when the core has its own process (async_core_client.py), never on the core's
loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferd.engine.core.core_output import CoreOutput, RequestEvents, SampleDelta, SampleFinish
from inferd.outputs import (
    CompletionOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    PositionLogprobs,
    RequestMetrics,
    RequestOutput,
)
from inferd.pooling_params import PoolingParams
from inferd.sampling_params import RequestOutputKind, SamplingParams
from inferd.tokenizer import IncrementalDetokenizer

_TOKEN_TEXTS = 1 << 16  # token strings of logprobs cached (the vocabulary can be 256k)


@dataclass
class _Sample:
    index: int
    detokenizer: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # How much was handed out already (delta outputs): characters of text, tokens (and their
    # logprobs), and whether the finish was.
    sent_text: int = 0
    sent_tokens: int = 0
    finish_sent: bool = False


@dataclass
class _Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    metrics: RequestMetrics
    stream: bool
    samples: list[_Sample] = field(default_factory=list)  # those started, in starting order
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    error: str | None = None
    finished: bool = False
    pooling: PoolingParams | None = None  # an embedding request: one output, when it ends
    streamed: int = -1  # tokens (of its longest sample) at its last streamed output; -1: none
    delta: bool = False  # its outputs hold only what is new (RequestOutputKind.DELTA)
    sent_prompt_logprobs: int = 0  # prompt positions handed out already (delta outputs)


class OutputProcessor:
    def __init__(self, tokenizer, stream_interval: int = 1):
        """`stream_interval`: a streaming request's output comes with its first news, then
        once this many tokens more arrived, and when it ends (EngineConfig.stream_interval)."""
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be at least 1, got {stream_interval}")
        self.tokenizer = tokenizer
        self.stream_interval = stream_interval
        self.requests: dict[str, _Request] = {}
        self._texts: dict[int, str] = {}

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams | PoolingParams, arrival_time: float,
                    max_tokens_param: int | None, stream: bool = False) -> None:  # fmt: skip
        """`stream`: an output after every step with news, not only the final one (unless
        its params ask for FINAL_ONLY), holding only the news when they ask for DELTA.
        PoolingParams: an embedding request, whose one output comes when it finished."""
        metrics = RequestMetrics(arrival_time=arrival_time, max_tokens_param=max_tokens_param)
        metrics.num_prompt_tokens = len(prompt_token_ids)
        if isinstance(params, PoolingParams):
            self.requests[request_id] = _Request(request_id, prompt, list(prompt_token_ids),
                                                 SamplingParams(), metrics, False,
                                                 pooling=params)  # fmt: skip
            return
        kind = params.output_kind
        stream = stream and kind != RequestOutputKind.FINAL_ONLY
        req = _Request(request_id, prompt, list(prompt_token_ids), params, metrics, stream,
                       delta=stream and kind == RequestOutputKind.DELTA)  # fmt: skip
        if params.prompt_logprobs is not None:
            req.prompt_logprobs = [None]  # nothing predicts the first prompt token
        self._sample(req, 0)  # listed from the start, as the first sample runs from the start
        self.requests[request_id] = req

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def forget(self, request_id: str) -> None:
        """Drop a request whose core side never started (its add was refused)."""
        self.requests.pop(request_id, None)

    def process(self, outputs: list[CoreOutput], now: float | None = None
                ) -> tuple[list[RequestOutput], list[SampleFinish]]:  # fmt: skip
        """The `RequestOutput`s to hand out (streaming requests with news, finished ones), and
        the samples the core must end (stop strings). `now`: time.monotonic for stop strings'
        finish times (default: the output's own)."""
        results, finishes = [], []
        for out in outputs:
            req = self.requests.get(out.request_id)
            if req is None:  # ended here already (a stop string): the core's news is late
                continue
            if out.events is not None:
                self._take_events(req, out.events)
            if req.pooling is not None:
                if out.finished:
                    del self.requests[req.request_id]
                    results.append(_embedding_output(req, out))
                continue
            for delta in out.samples:
                sample = self._sample(req, delta.index)
                if sample.finish_reason is None and self._take(req, sample, delta, out.time):
                    finishes.append(SampleFinish(req.request_id, sample.index))
            if out.new_prompt_logprobs:
                req.prompt_logprobs += [e.position(self._names(e.token_ids))
                                        for e in out.new_prompt_logprobs]  # fmt: skip
            req.error = req.error or out.error
            started = len(req.samples) == req.params.n or out.finished
            if out.finished or (started and all(s.finish_reason for s in req.samples)):
                req.finished = True
                req.metrics.finished_time = out.time if out.finished else (now or out.time)
                del self.requests[req.request_id]
            if req.finished or (req.stream and self._stream_due(req)):
                results.append(_delta_output(req) if req.delta else _request_output(req))
        return results, finishes

    def _stream_due(self, req: _Request) -> bool:
        if self.stream_interval == 1:
            return True
        tokens = max(len(s.token_ids) for s in req.samples)
        if req.streamed >= 0 and tokens - req.streamed < self.stream_interval:
            return False
        req.streamed = tokens
        return True

    def _take_events(self, req: _Request, e: RequestEvents) -> None:
        m = req.metrics
        m.queued_time, m.first_scheduled_time = e.queued_time, e.first_scheduled_time
        m.num_cached_tokens, m.preemption_times = e.num_cached_tokens, e.preemption_times
        m.num_preemptions = len(e.preemption_times)

    def _sample(self, req: _Request, index: int) -> _Sample:
        for sample in req.samples:
            if sample.index == index:
                return sample
        detokenizer = IncrementalDetokenizer(self.tokenizer, req.prompt_token_ids,
                                             req.params.skip_special_tokens)  # fmt: skip
        req.samples.append(_Sample(index, detokenizer))
        return req.samples[-1]

    def _take(self, req: _Request, sample: _Sample, delta: SampleDelta, time: float) -> bool:
        """Append a sample's new tokens. True when a stop string ended it here."""
        params, m = req.params, req.metrics
        tokens = delta.new_token_ids
        for i, token in enumerate(tokens):
            sample.token_ids.append(token)
            if delta.new_logprobs:
                entry = delta.new_logprobs[i]
                sample.logprobs.append(entry.position(self._names(entry.token_ids)))
                sample.cumulative_logprob += entry.logprobs[0]
            m.first_token_time = m.first_token_time or time
            m.last_token_time = time
            m.num_generation_tokens += 1
            if i == len(tokens) - 1 and delta.finish_reason == "stop":
                break  # a stop token: it ends the text where it is, never shown
            before = len(sample.text)
            piece = sample.detokenizer.step([token])
            if piece:
                # NOTE: with the attribute's reference dropped first, CPython grows the string
                # in place; `sample.text += piece` would copy the whole text at every token.
                text, sample.text = sample.text, ""
                text += piece
                sample.text = text
            n_out = len(sample.token_ids)
            if params.stop and n_out >= params.min_tokens and _stop_string(sample, params,
                                                                             before):  # fmt: skip
                return True
        sample.finish_reason = delta.finish_reason
        sample.stop_reason = delta.stop_reason
        if delta.finish_reason == "length":
            sample.text += sample.detokenizer.flush()  # an incomplete character at the end
        return False

    def _names(self, token_ids: list[int]) -> list[str]:
        """Each token's own text, as logprobs show it."""
        names = []
        for t in token_ids:
            text = self._texts.get(t)
            if text is None:
                if len(self._texts) >= _TOKEN_TEXTS:
                    self._texts.clear()
                text = self._texts[t] = self.tokenizer.decode([t], skip_special_tokens=False)
            names.append(text)
        return names


def _stop_string(sample: _Sample, params: SamplingParams, before: int) -> bool:
    """Whether a stop string ends in the text that arrived after `before`; if so, cut the text
    there and finish the sample."""
    longest = max(len(s) for s in params.stop)
    start = max(0, before - longest + 1)  # only a match ending in the new text is new
    best = None
    for stop in params.stop:
        i = sample.text.find(stop, start)
        if i != -1 and (best is None or i < best[0]):
            best = (i, stop)
    if best is None:
        return False
    i, stop = best
    sample.text = sample.text[: i + len(stop)] if params.include_stop_str_in_output else (
        sample.text[:i])  # fmt: skip
    sample.finish_reason, sample.stop_reason = "stop", stop
    return True


def _streamable_end(sample: _Sample, params: SamplingParams) -> int:
    """How much of the sample's text may be shown now. NOTE: a stop string completed later
    starts at or after this point (it would otherwise have been found already), so text shown
    never has to be taken back."""
    if sample.finish_reason is not None or not params.stop:
        return len(sample.text)
    return max(0, len(sample.text) - (max(len(s) for s in params.stop) - 1))


def _embedding_output(req: _Request, out: CoreOutput) -> EmbeddingRequestOutput:
    req.metrics.finished_time = out.time
    return EmbeddingRequestOutput(req.request_id, EmbeddingOutput(out.embedding or []),
                                  req.prompt_token_ids, True, req.metrics.snapshot(),
                                  req.metrics.num_cached_tokens, out.error, req.prompt)  # fmt: skip


def _request_output(req: _Request) -> RequestOutput:
    completions = [
        CompletionOutput(
            index=s.index,
            text=s.text[: _streamable_end(s, req.params)],
            token_ids=list(s.token_ids),
            cumulative_logprob=s.cumulative_logprob if s.logprobs else None,
            logprobs=list(s.logprobs) if req.params.logprobs is not None else None,
            finish_reason=s.finish_reason,
            stop_reason=s.stop_reason,
        )
        for s in req.samples
    ]
    prompt_logprobs = None if req.prompt_logprobs is None else list(req.prompt_logprobs)
    # NOTE: a snapshot: this request's metrics go on changing while a consumer reads the output.
    metrics = req.metrics.snapshot()
    return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, completions,
                         req.finished, prompt_logprobs, metrics, metrics.num_cached_tokens,
                         req.error)  # fmt: skip


def _delta_output(req: _Request) -> RequestOutput:
    """What is new since the request's previous output: the samples with news (every sample in
    the last output, so that it shows each one's finish), each with its new text, tokens and
    logprobs. NOTE: held-back text stays unsent until the holdback releases it; the text sent
    is never taken back (`_streamable_end`)."""
    completions = []
    for s in req.samples:
        end = _streamable_end(s, req.params)
        tokens = len(s.token_ids)
        news = tokens > s.sent_tokens or end > s.sent_text
        newly_finished = s.finish_reason is not None and not s.finish_sent
        if not (news or newly_finished or req.finished):
            continue
        completions.append(
            CompletionOutput(
                index=s.index,
                text=s.text[s.sent_text : end],
                token_ids=s.token_ids[s.sent_tokens :],
                cumulative_logprob=s.cumulative_logprob if s.logprobs else None,
                logprobs=s.logprobs[s.sent_tokens :] if req.params.logprobs is not None else None,
                finish_reason=s.finish_reason,
                stop_reason=s.stop_reason,
            )
        )
        s.sent_text, s.sent_tokens = end, tokens
        s.finish_sent = s.finish_reason is not None
    prompt_logprobs = None
    if req.prompt_logprobs is not None:
        prompt_logprobs = req.prompt_logprobs[req.sent_prompt_logprobs :]
        req.sent_prompt_logprobs = len(req.prompt_logprobs)
    metrics = req.metrics.snapshot()  # NOTE: as in _request_output, the metrics go on changing
    return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, completions,
                         req.finished, prompt_logprobs, metrics, metrics.num_cached_tokens,
                         req.error, delta=True)  # fmt: skip
