"""The engine: requests in, one `step()` at a time, incremental outputs out.

    step = schedule → run the model → sample → append tokens, check stops → outputs

It owns the model, the KV cache, the scheduler and the sampler; it is not thread-safe, and the
server drives it from a single loop thread. A failure while running a step fails the requests of
that step (with an error in their output) and leaves the engine usable.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import time
from dataclasses import dataclass

import torch

from inferd.config import EngineConfig
from inferd.engine.kv_cache import KVCacheManager
from inferd.engine.model_setup import EngineSetup, set_up_engine
from inferd.engine.request import Request, Sequence, SequenceStatus, update_block_hashes
from inferd.engine.runner import SequenceStep
from inferd.engine.sampler import Sampler, SamplingRow, make_generator, prompt_logprobs
from inferd.engine.scheduler import Scheduler, SchedulerOutput
from inferd.engine.stopping import append_token, streamable_text_end
from inferd.errors import EngineDeadError
from inferd.outputs import CompletionOutput, RequestMetrics, RequestOutput
from inferd.sampling_params import SamplingParams
from inferd.tokenizer import IncrementalDetokenizer

log = logging.getLogger(__name__)


@dataclass
class EngineStats:
    """A snapshot for metrics and logs; the counters are cumulative since start."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float  # fraction of KV blocks in use (most-used group)
    num_preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    prompt_tokens: int  # prompt tokens computed (cache hits excluded, recompute included)
    generation_tokens: int
    steps: int


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None, **overrides):
        config = config or EngineConfig(**overrides)
        setup: EngineSetup = set_up_engine(config)
        self.config = config
        self.setup = setup
        self.model_config = setup.model_config
        self.tokenizer = setup.tokenizer
        self.runner = setup.runner
        self.max_model_len = setup.max_model_len
        self.block_size = config.block_size
        windows = [w for w, _ in self.model_config.kv_groups()]
        self.kv = KVCacheManager(
            windows, setup.kv_plan.num_blocks, config.block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(self.kv, setup.max_num_seqs, setup.max_num_batched_tokens)
        self.sampler = Sampler(seed=config.seed, device=setup.device)
        # Salt for prefix-cache hashes: blocks of different weights or dtypes never match.
        ident = f"{setup.checkpoint.path}|{setup.dtype}|{config.quantization}".encode()
        self.root_hash = hashlib.sha256(ident).digest()
        self.eos_ids = tuple(self.tokenizer.eos_token_ids) or self.model_config.eos_token_ids
        self.requests: dict[str, Request] = {}
        self._seq_ids = itertools.count()
        self._pending: list[RequestOutput] = []  # outputs of aborted requests, sent next step
        self.dead: str | None = None  # why the engine can run no more steps
        self.generation_tokens = 0
        self.steps = 0

    # ---- requests ----------------------------------------------------------------------------
    def tokenize_prompt(self, prompt: str | list[int] | dict) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, list | tuple):
            return None, list(prompt)
        raise ValueError(
            f"prompt must be a string, a list of token ids or a dict, got {type(prompt).__name__}"
        )

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int] | dict,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        stream: bool = False,
    ) -> Request:
        """Validate and queue a request. Raises ValueError (nothing queued) on bad input."""
        params = params or SamplingParams()
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        text, ids = self.tokenize_prompt(prompt)
        vocab = self.model_config.vocab_size
        if not ids:
            raise ValueError("the prompt is empty: it must contain at least one token")
        bad = next((t for t in ids if not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad!r} is outside the vocabulary [0, {vocab})")
        params.verify(vocab, self.config.max_n, self.config.max_stop_strings)
        room = self.max_model_len - len(ids)
        if room < 1:
            raise ValueError(
                f"the prompt has {len(ids)} tokens, but max_model_len is {self.max_model_len}: "
                "no room is left to generate"
            )
        max_tokens = params.max_tokens if params.max_tokens is not None else room
        if len(ids) + max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) = "
                f"{len(ids) + max_tokens} exceeds max_model_len ({self.max_model_len})"
            )
        metrics = RequestMetrics(arrival_time=arrival_time or time.monotonic())
        metrics.num_prompt_tokens = len(ids)
        req = Request(request_id, text, ids, params, metrics, max_tokens, forked=params.n == 1,
                      stream=stream)  # fmt: skip
        req.sequences.append(self._new_sequence(req, 0))
        if params.prompt_logprobs is not None:
            req.prompt_logprobs = [None]
        self.requests[request_id] = req
        self.scheduler.add(req.sequences[0])
        return req

    def _new_sequence(self, req: Request, index: int) -> Sequence:
        generator = None
        if req.params.seed is not None:
            # Sample i of a seeded request uses seed + i: reproducible, and distinct samples.
            generator = make_generator(req.params.seed + index, self.setup.device)
        seq = Sequence(next(self._seq_ids), req, index, list(req.prompt_token_ids),
                       len(req.prompt_token_ids), generator=generator)  # fmt: skip
        seq.detokenizer = IncrementalDetokenizer(
            self.tokenizer, req.prompt_token_ids, req.params.skip_special_tokens
        )
        update_block_hashes(seq, self.block_size, self.root_hash)
        return seq

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now and free its blocks; its final output comes with the next step."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        for seq in req.sequences:
            if not seq.is_finished:
                self.scheduler.remove(seq)
                seq.status, seq.finish_reason = SequenceStatus.FINISHED, "abort"
        req.forked = True
        req.metrics.finished_time = time.monotonic()
        self._pending.append(self._output(req))
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self._pending)

    # ---- the step ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs, self._pending = self._pending, []
        sched = self.scheduler.schedule()
        if not sched.scheduled:
            return outputs
        self.steps += 1
        now = time.monotonic()
        for s in sched.scheduled:
            m = s.seq.request.metrics
            m.first_scheduled_time = m.first_scheduled_time or now
        steps = [
            SequenceStep(
                s.seq.token_ids[s.seq.num_computed : s.seq.num_computed + s.num_new_tokens],
                s.seq.num_computed,
                s.seq.block_tables,
                s.needs_logits,
                all_logits=s.seq.request.prompt_logprobs is not None
                and s.seq.num_computed < s.seq.num_prompt_tokens,
            )
            for s in sched.scheduled
        ]
        try:
            self.runner.clear_blocks(self.kv.take_fresh_blocks())
            logits, every = self.runner.execute_with_prompt_logits(steps)
            touched = self._sample_and_update(sched, logits, every)
        except EngineDeadError as e:  # e.g. a tensor-parallel worker died: nothing can run
            self.dead = str(e)
            log.error("engine dead: %s", e)
            self._fail(set(self.requests), e)
            raise
        except Exception as e:  # a failed step fails its requests, not the engine
            log.exception("step failed")
            return outputs + self._fail({s.seq.request.request_id for s in sched.scheduled}, e)
        for req in touched:
            if req.finished:
                self.requests.pop(req.request_id, None)
                req.metrics.finished_time = time.monotonic()
            outputs.append(self._output(req))
        return outputs

    def _sample_and_update(self, sched: SchedulerOutput, logits, every) -> list[Request]:
        # (logits row, sequence, parent to fork from): a request whose prompt just finished
        # and wants n samples reads its one logits row n times.
        plan: list[tuple[int, Sequence, Sequence | None]] = []
        row = 0
        for i, s in enumerate(sched.scheduled):
            seq = s.seq
            if s.num_new_tokens > 1 or seq.num_output_tokens == 0:  # not a decode
                self.scheduler.counters.prompt_tokens_computed += s.num_new_tokens
            seq.num_computed += s.num_new_tokens
            if i in every:
                self._prompt_logprobs(seq, every[i], s.num_new_tokens)
            if not s.needs_logits:
                continue
            plan.append((row, seq, None))
            req = seq.request
            if not req.forked:
                for k in range(1, req.params.n):
                    child = self._new_sequence(req, k)
                    req.sequences.append(child)
                    plan.append((row, child, seq))
                req.forked = True
            row += 1
        touched: dict[str, Request] = {s.seq.request.request_id: s.seq.request
                                       for s in sched.scheduled}  # fmt: skip
        if plan:
            index = torch.tensor([p[0] for p in plan], device=logits.device)
            rows = [
                SamplingRow(
                    seq.request.params,
                    seq.request.prompt_token_ids,
                    seq.output_token_ids,
                    seq.generator,
                    self.eos_ids,
                )  # fmt: skip
                for _, seq, _ in plan
            ]
            result = self.sampler(logits.index_select(0, index), rows)
            now = time.monotonic()
            for k, (_, seq, parent) in enumerate(plan):
                if parent is not None:
                    copies = self.scheduler.fork(parent, seq)
                    # Zero first-use blocks now, or the next step would wipe the copies.
                    self.runner.clear_blocks(self.kv.take_fresh_blocks())
                    self.runner.copy_blocks(copies)
                self._append(seq, result.token_ids[k], result.logprobs[k], now)
        for s in sched.scheduled:
            self.kv.cache_computed_blocks(s.seq)
        for _, seq, _ in plan:
            if seq.finish_reason is not None:
                self._finish(seq)
        return [r for r in touched.values() if r.stream or r.finished]

    def _append(self, seq: Sequence, token: int, logprobs, now: float) -> None:
        req = seq.request
        append_token(seq, token, self.eos_ids, req.max_tokens, self.max_model_len)
        update_block_hashes(seq, self.block_size, self.root_hash)
        if logprobs is not None:
            seq.logprobs.append(logprobs)
            seq.cumulative_logprob += logprobs[token].logprob
        m = req.metrics
        m.first_token_time = m.first_token_time or now
        m.last_token_time = now
        m.num_generation_tokens += 1
        self.generation_tokens += 1

    def _finish(self, seq: Sequence) -> None:
        self.scheduler.remove(seq)
        seq.status = SequenceStatus.FINISHED

    def _prompt_logprobs(self, seq: Sequence, logits: torch.Tensor, n: int) -> None:
        """Logprobs of prompt tokens 1..P-1 from the logits of the positions before them."""
        req = seq.request
        start = seq.num_computed - n  # first position computed in this step
        last = min(seq.num_computed, seq.num_prompt_tokens - 1)  # positions that predict prompt
        if last <= start:
            return
        targets = seq.token_ids[start + 1 : last + 1]
        req.prompt_logprobs.extend(
            prompt_logprobs(logits[: last - start], targets, req.params.prompt_logprobs)
        )

    def _fail(self, request_ids: set[str], error: Exception) -> list[RequestOutput]:
        outputs = []
        for rid in request_ids:
            req = self.requests.pop(rid, None)
            if req is None:
                continue
            for seq in req.sequences:
                if not seq.is_finished:
                    self.scheduler.remove(seq)
                    seq.status, seq.finish_reason = SequenceStatus.FINISHED, "error"
            req.forked = True
            req.error = f"{type(error).__name__}: {error}"
            req.metrics.finished_time = time.monotonic()
            outputs.append(self._output(req))
        return outputs

    def _output(self, req: Request) -> RequestOutput:
        completions = []
        for seq in req.sequences:
            end = streamable_text_end(seq)
            completions.append(
                CompletionOutput(
                    index=seq.sample_index,
                    text=seq.text[:end],
                    token_ids=seq.output_token_ids,
                    cumulative_logprob=seq.cumulative_logprob if seq.logprobs else None,
                    logprobs=list(seq.logprobs) if req.params.logprobs is not None else None,
                    finish_reason=seq.finish_reason,
                    stop_reason=seq.stop_reason,
                )
            )
        return RequestOutput(
            request_id=req.request_id,
            prompt=req.prompt,
            prompt_token_ids=req.prompt_token_ids,
            outputs=completions,
            finished=req.finished,
            prompt_logprobs=req.prompt_logprobs,
            metrics=req.metrics,
            num_cached_tokens=req.metrics.num_cached_tokens,
            error=req.error,
        )

    def shutdown(self) -> None:
        """Release what outlives the object: tensor-parallel worker processes."""
        stop = getattr(self.runner, "shutdown", None)
        if stop is not None:
            stop()

    # ---- statistics --------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        c = self.scheduler.counters
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=self.kv.usage,
            num_preemptions=c.num_preemptions,
            prefix_cache_queries=c.prefix_cache_queries,
            prefix_cache_hits=c.prefix_cache_hits,
            prompt_tokens=c.prompt_tokens_computed,
            generation_tokens=self.generation_tokens,
            steps=self.steps,
        )
