"""The engine: requests in, one `step()` at a time, incremental outputs out.

    step = scheduler.schedule() → executor.execute() (model, sampler)
           → scheduler.update_from_output()

The scheduler owns every request's state, the executor owns the device; this class wires them
and turns requests into outputs. It is not thread-safe: the server drives it from one loop
thread (`async_engine.py`). A failure while running a step fails the requests of that step
(with an error in their output) and leaves the engine usable.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
from concurrent.futures import Future
from dataclasses import replace

from inferd.config import EngineConfig
from inferd.engine.executor import Executor
from inferd.engine.input_processor import InputProcessor
from inferd.engine.kv_cache import KVCacheManager
from inferd.engine.request import Request
from inferd.engine.request_output import request_output
from inferd.engine.sampler import Sampler
from inferd.engine.scheduler import Scheduler
from inferd.engine.setup import EngineSetup, describe_model, model_identity, set_up_engine
from inferd.engine.speculative import Speculation
from inferd.engine.structured_outputs import StructuredOutputs
from inferd.engine_client import EngineStats, ProfilerStateError, PromptInput, TraceFiles
from inferd.errors import EngineDeadError, InvalidRequest
from inferd.outputs import RequestOutput
from inferd.profiling.step_timer import StepTimer
from inferd.sampling_params import SamplingParams
from inferd.spec_decode import SpeculativeConfig
from inferd.step_timing import StepTiming

__all__ = ["EngineStats", "LLMEngine"]

log = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None, **overrides):
        config = config or EngineConfig(**overrides)
        # Checked before anything loads: a bad value fails in one line, at once.
        spec_config = SpeculativeConfig.parse(config.speculative_config)
        setup: EngineSetup = set_up_engine(config)
        self.config, self.setup = config, setup
        self.model_config = setup.model_config
        self.tokenizer = setup.tokenizer
        self.runner = setup.runner
        self.max_model_len = setup.max_model_len
        self.model_info = describe_model(setup, config)
        eos_ids = tuple(self.tokenizer.eos_token_ids) or self.model_config.eos_token_ids
        windows = [w for w, _ in self.model_config.kv_groups()]
        self.kv = KVCacheManager(
            windows, setup.kv_plan.num_blocks, config.block_size, config.enable_prefix_caching
        )
        # Salt for prefix-cache hashes: blocks of different weights or dtypes never match.
        hash_root = hashlib.sha256(model_identity(setup, config).encode()).digest()
        # Structured outputs: grammars compile in a worker thread, on first use.
        self.grammars = StructuredOutputs(self.tokenizer, self.model_config.vocab_size,
                                          setup.max_num_seqs)  # fmt: skip
        self.speculation = None
        if spec_config is not None:
            self.speculation = Speculation(spec_config, self.max_model_len)
        self.scheduler = Scheduler(self.kv, setup.max_num_seqs, setup.max_num_batched_tokens,
                                   self.max_model_len, eos_ids, hash_root,
                                   self.speculation, self.grammars)  # fmt: skip
        # The phases of every step (inferd/step_timing.py); a trace, while one runs.
        self.step_timer = StepTimer()
        self.trace = None  # a profiling.trace.TraceSession while a trace runs
        self._ended_trace: TraceFiles | None = None  # a trace that hit its step limit
        self.executor = Executor(self.runner, Sampler(config.seed, setup.device), eos_ids,
                                 grammars=self.grammars, timer=self.step_timer)  # fmt: skip
        self.inputs = InputProcessor(self.tokenizer, self.model_config.vocab_size,
                                     self.max_model_len, config.max_n, config.max_stop_strings,
                                     setup.device,
                                     max_stop_string_length=config.max_stop_string_length,
                                     max_logprobs=config.max_logprobs,
                                     grammars=self.grammars)  # fmt: skip
        self._pending: list[RequestOutput] = []  # outputs of aborted requests, sent next step
        self.dead: str | None = None  # why the engine can run no more steps

    @property
    def requests(self) -> dict[str, Request]:
        """Unfinished requests by id."""
        return self.scheduler.requests

    # ---- requests ----------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: PromptInput,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        stream: bool = False,
    ) -> Request:
        """Validate and queue a request. Raises InvalidRequest (nothing queued) on bad input,
        EngineDeadError when the engine can run no more steps."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        if request_id in self.scheduler.requests:
            raise InvalidRequest(None, f"request_id {request_id!r} is already in use")
        req = self.inputs.make_request(
            request_id, prompt, params or SamplingParams(), arrival_time, stream
        )
        self.scheduler.add_request(req)
        return req

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now and free its blocks; its final output comes with the next step."""
        req = self.scheduler.abort_request(request_id)
        if req is not None:
            self._pending.append(request_output(req))
        return req is not None

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self._pending)

    # ---- the step ----------------------------------------------------------------------------
    def compile_grammar(self, params: SamplingParams) -> Future | None:
        """Start compiling the request's grammar (any thread; never blocks): a future whose
        result means compiled, or None when the request has none. Awaiting it before
        `add_request` turns a bad spec into an InvalidRequest before anything streams."""
        spec = params.structured_outputs
        return None if spec is None else self.grammars.submit(spec)

    def check_grammar(self, params: SamplingParams, timeout: float | None = None) -> None:
        """Compile the request's grammar now (blocking): raise its InvalidRequest, if any."""
        handle = self.compile_grammar(params)
        if handle is not None:
            concurrent.futures.wait([handle], timeout)
            if handle.done():
                self.grammars.check(handle, params.structured_outputs)

    def step(self) -> list[RequestOutput]:
        outputs, self._pending = self._pending, []
        timer = self.step_timer
        timer.start()  # phases begin in the executor and the runner, then "output" below
        scheduled = self.scheduler.schedule()
        outputs += [request_output(r) for r in self.scheduler.take_failed()]
        if not scheduled.scheduled:
            timer.cancel()
            return outputs
        try:
            result = self.executor.execute(scheduled)
            timer.begin("output")
            reported = self.scheduler.update_from_output(scheduled, result)
        except EngineDeadError as e:  # e.g. a tensor-parallel worker died: nothing can run
            timer.cancel()
            self.dead = str(e)
            log.error("engine dead: %s", e)
            self.scheduler.fail_requests(set(self.scheduler.requests), e)
            raise
        except Exception as e:  # a failed step fails its requests, not the engine
            timer.cancel()
            log.exception("step failed")
            reported = self.scheduler.fail_step(scheduled, e)
        outputs += [request_output(r) for r in reported]
        timer.finish(scheduled.num_tokens, _computes_prompt(scheduled))
        if self.trace is not None and self.trace.count_step():
            log.warning("the trace reached %d steps: stopping it", self.trace.max_steps)
            self._ended_trace = self.stop_profile()
        return outputs

    def shutdown(self) -> None:
        """Release what outlives the object: tensor-parallel worker processes, the grammar
        compiler's thread."""
        self.executor.shutdown()
        self.grammars.shutdown()

    def stats(self) -> EngineStats:
        return replace(self.scheduler.stats(), step_timing=self.step_timer.snapshot())

    def step_timing(self) -> StepTiming:
        """Cumulative phase timings of every step so far (inferd/step_timing.py)."""
        return self.step_timer.snapshot()

    # ---- profiling (inferd/profiling/, docs/profiling.md) ------------------------------------
    def start_profile(self, directory: str) -> None:
        """Trace the following steps with torch.profiler, until `stop_profile`."""
        from inferd.profiling.trace import TraceSession

        if self.trace is not None:
            raise ProfilerStateError("a trace is already running; stop it first")
        session = TraceSession(directory, self.step_timer, self.runner, self.setup.device)
        session.start()
        self.trace, self._ended_trace = session, None

    def stop_profile(self) -> TraceFiles:
        """End the trace and write its files (inferd/profiling/trace.py)."""
        if self.trace is None:
            if self._ended_trace is not None:  # it stopped itself at its step limit
                ended, self._ended_trace = self._ended_trace, None
                return ended
            raise ProfilerStateError("no trace is running; start one first")
        trace, self.trace = self.trace, None
        return trace.stop()


def _computes_prompt(out) -> bool:
    """Whether any sequence of the step computes prompt tokens (a prefill step)."""
    return any(s.num_computed < s.seq.num_prompt_tokens for s in out.scheduled)
