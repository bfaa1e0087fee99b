"""The engine core: requests in as token ids and SamplingParams, one `step()` at a time, and per
step the news of each request out as plain data (`CoreOutput`: new token ids, logprobs, finish
reasons).

    step = scheduler.schedule() ──StepRecord──▶ executor.execute() (runner, model, sampler)
           ──ModelRunnerOutput──▶ scheduler.update_from_output() ──▶ [CoreOutput]

The scheduler owns every request's state, the executor owns the device; this class wires them.
It knows no text: the front end (engine/frontend/llm_engine.py in-process,
engine/frontend/async_core_client.py across a process boundary) tokenizes, detokenizes, checks stop
strings and builds `RequestOutput`s. It is not thread-safe: one loop drives it
(engine/core/core_loop.py, in its own process or a thread), or the caller's thread
(engine/frontend/llm_engine.py). A failure while running a step fails the requests of that step
(with an error in their output) and leaves the core usable.
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import logging
import os
from dataclasses import replace

from inferd.config import EngineConfig
from inferd.engine.core.core_output import CoreOutput, CoreRequest
from inferd.engine.core.sleep_mode import SleepMode
from inferd.engine.core.step_efficiency_meter import engine_meter
from inferd.engine.execution.executor import Executor
from inferd.engine.execution.setup import EngineSetup, describe_model, model_identity, set_up_engine
from inferd.engine.kv_tiers.connector import remove_memory_tier
from inferd.engine.kv_tiers.open_tiers import check_tier_flags, open_connector
from inferd.engine.sampling.grammar_mask import GrammarMasks
from inferd.engine.sampling.infill_sampler import TokenPieces
from inferd.engine.sampling.sampler import Sampler
from inferd.engine.sampling.structured_outputs import (
    ConstraintStats,
    GrammarCompilation,
    StructuredOutputs,
)
from inferd.engine.scheduling.adapter_slots import AdapterSlots
from inferd.engine.scheduling.kv_cache import KVCacheManager
from inferd.engine.scheduling.request import Request, Sequence
from inferd.engine.scheduling.scheduler import Scheduler
from inferd.engine.scheduling.speculative import Speculation
from inferd.engine_client import EngineStats, ProfilerStateError, TraceFiles
from inferd.errors import EngineDeadError, InvalidRequest
from inferd.outputs import RequestMetrics
from inferd.profiling.step_timer import StepTimer
from inferd.sampling_params import SamplingParams
from inferd.spec_decode import SpeculativeConfig
from inferd.step_efficiency import StepEfficiency
from inferd.step_timing import StepTiming
from inferd.version import __version__

log = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, config: EngineConfig, owner_pid: int | None = None):
        """`owner_pid`: the server process this core serves (its RAM KV tier is that
        process's; engine/kv_tiers/); None: this process."""
        # Checked before anything loads: a bad value fails in one line, at once.
        spec_config = SpeculativeConfig.parse(config.speculative_config)
        check_tier_flags(config)
        setup: EngineSetup = set_up_engine(config)
        self.config, self.setup = config, setup
        self.model_config = setup.model_config
        self.tokenizer = setup.tokenizer  # the grammar engine's vocabulary comes from it
        self.runner = setup.runner
        self.max_model_len = setup.max_model_len
        self.model_info = describe_model(setup, config)
        self.eos_token_ids = tuple(self.tokenizer.eos_token_ids) or self.model_config.eos_token_ids
        windows = [w for w, _ in self.model_config.kv_groups()]
        self.kv = KVCacheManager(
            windows, setup.kv_plan.num_blocks, config.block_size, config.enable_prefix_caching
        )
        # Salt for prefix-cache hashes: blocks of different weights or dtypes never match (the
        # data-parallel router hashes prompts the same way: engine/frontend/dp_router.py).
        self.hash_root = hashlib.sha256(model_identity(setup, config).encode()).digest()
        # Structured outputs: grammars compile in a worker thread, on first use.
        stats = ConstraintStats()
        self.grammars = StructuredOutputs(self.tokenizer, self.model_config.vocab_size, stats)
        self.speculation = None
        if spec_config is not None:
            self.speculation = Speculation(spec_config, self.max_model_len)
        adapters = AdapterSlots(config.max_loras) if config.enable_lora else None
        self.owns_memory_tier = owner_pid is None
        self.connector = open_connector(config, self.runner, self.hash_root,
                                        _weights_identity(setup.checkpoint.path), __version__,
                                        owner_pid or os.getpid())  # fmt: skip
        if self.connector is not None and self.owns_memory_tier and config.kv_offload_memory:
            atexit.register(remove_memory_tier, os.getpid())  # also without a shutdown()
        self.scheduler = Scheduler(self.kv, setup.max_num_seqs, setup.max_num_batched_tokens,
                                   self.max_model_len, self.eos_token_ids, self.hash_root,
                                   self.speculation, adapters, self.connector,
                                   config.scheduling_policy, config.max_queue_time)  # fmt: skip
        # The phases of every step (inferd/step_timing.py); a trace, while one runs.
        self.step_timer = StepTimer()
        # Each step's bytes read and FLOPs, MBU and MFU (inferd/step_efficiency.py).
        self.efficiency = engine_meter(setup, config)
        self.trace = None  # a profiling.trace.TraceSession while a trace runs
        self._ended_trace: TraceFiles | None = None  # a trace that hit its step limit
        # The infill sampler reads token texts from the grammar engine's vocabulary; a model
        # with FIM tokens builds it now, in the background (engine/sampling/infill_sampler.py).
        pieces = TokenPieces(lambda: self.grammars.manager.info)
        if getattr(self.tokenizer, "fim", None) is not None:
            self.grammars.manager  # noqa: B018 - made here, on this thread, before the warm-up
            pieces.warm()
        sampler = Sampler(config.seed, setup.device, grammar=GrammarMasks(stats), pieces=pieces)
        self.executor = Executor(self.runner, sampler, self.eos_token_ids, self.step_timer)
        self._seq_ids = itertools.count()
        self._pending: list[CoreOutput] = []  # outputs of aborted requests, sent next step
        self.dead: str | None = None  # why the core can run no more steps
        self.sleep_mode = SleepMode(self)  # POST /sleep, /wake_up (sleep_mode.py)

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, request: CoreRequest) -> None:
        """Queue a checked request (engine/frontend/input_processor.py). Raises InvalidRequest when
        its id is in use or its grammar failed to compile (nothing queued), EngineDeadError when
        the core can run no more steps."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        self.sleep_mode.check_awake()  # ModelAsleep: its pool (maybe its weights) are gone
        if request.request_id in self.scheduler.requests:
            raise InvalidRequest(None, f"request_id {request.request_id!r} is already in use")
        if request.lora_request is not None:
            self._check_adapter(request.lora_request)
        self.scheduler.add_request(self._request(request))

    def _check_adapter(self, lora) -> None:
        """Read the adapter's tensors now (kept for its slot): one that does not fit the model
        is this request's InvalidRequest, never a failed step of everyone it would share."""
        if self.scheduler.adapters is None:
            raise InvalidRequest("lora_request", "this engine serves no LoRA adapters: start it "
                                 "with enable_lora=True (inferd serve --enable-lora)")  # fmt: skip
        self.runner.adapter_cache.get(lora, self.runner.model.lora)

    def _request(self, r: CoreRequest) -> Request:
        params, ids = r.params, list(r.prompt_token_ids)
        metrics = RequestMetrics(arrival_time=r.arrival_time, max_tokens_param=params.max_tokens)
        metrics.num_prompt_tokens = len(ids)
        req = Request(r.request_id, ids, params, metrics, r.max_tokens, forked=params.n == 1,
                      cache_salt=r.cache_salt, pooling=r.pooling,
                      lora=r.lora_request, priority=r.priority,
                      background=r.background)  # fmt: skip
        samples = [Sequence(next(self._seq_ids), req, i, list(ids), len(ids))
                   for i in range(params.n)]  # fmt: skip
        req.sequences, req.forks = samples[:1], samples[1:]
        req.images = list(r.images)
        if params.structured_outputs is not None:
            req.grammar = self.grammars.submit(params.structured_outputs)
        return req

    def compile_grammar(self, params: SamplingParams) -> GrammarCompilation | None:
        """Start compiling the request's grammar (any thread; never blocks), or None when it
        has none. Waiting for it before `add_request` turns a bad spec into an InvalidRequest
        before anything streams."""
        spec = params.structured_outputs
        return None if spec is None else self.grammars.submit(spec)

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now and free its blocks; its final output comes with the next step."""
        out = self.scheduler.abort_request(request_id)
        if out is not None:
            self._pending.append(out)
        return out is not None

    def finish_sample(self, request_id: str, index: int) -> bool:
        """The front end saw a stop string: end that sample before the next step. True when the
        request ended with it (no output says so)."""
        return self.scheduler.finish_sample(request_id, index)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self._pending)

    # ---- the step ----------------------------------------------------------------------------
    def step(self) -> list[CoreOutput]:
        outputs, self._pending = self._pending, []
        timer = self.step_timer
        timer.start()  # phases begin in the executor and the runner, then "output" below
        record = self.scheduler.schedule()
        outputs += self.scheduler.take_failed()
        if not record.rows:
            timer.cancel()
            return outputs
        sequences = self.scheduler.sequences
        prefill = any(r.num_computed < sequences[r.seq_id].num_prompt_tokens for r in record.rows)
        try:
            result = self.executor.execute(record)
            timer.begin("output")
            outputs += self.scheduler.update_from_output(record, result)
            self._save_named_blocks()
        except EngineDeadError as e:  # e.g. a tensor-parallel worker died: nothing can run
            timer.cancel()
            self.dead = str(e)
            log.error("engine dead: %s", e)
            self.scheduler.fail_requests(set(self.scheduler.requests), e)
            raise
        except Exception as e:  # a failed step fails its requests, not the engine
            timer.cancel()
            log.exception("step failed")
            outputs += self.scheduler.fail_step(record, e)
        seconds = timer.finish(record.num_tokens, prefill)
        if seconds is not None:
            self.efficiency.observe(record.rows, seconds, prefill)
        if self.trace is not None and self.trace.count_step():
            log.warning("the trace reached %d steps: stopping it", self.trace.max_steps)
            self._ended_trace = self.stop_profile()
        return outputs

    def _save_named_blocks(self) -> None:
        """Copy the blocks this step named out of the pool for the KV connector, now: the next
        step may hand them out again. The tiers are written by the connector's thread."""
        saves = self.scheduler.take_saves() if self.connector is not None else []
        if saves:
            per_group = [list(blocks) for blocks in zip(*(b for _, b in saves))]
            self.connector.save([h for h, _ in saves], self.runner.read_blocks(per_group))

    def shutdown(self) -> None:
        """Release what outlives the object: tensor-parallel worker processes, the grammar
        compiler's thread, the KV connector's threads (what they hold is written first) and a
        RAM tier this process owns."""
        self.executor.shutdown()
        self.grammars.shutdown()
        if self.connector is not None:
            self.connector.close()
            if self.owns_memory_tier and self.config.kv_offload_memory:
                remove_memory_tier(os.getpid())

    def stats(self) -> EngineStats:
        stats = replace(self.scheduler.stats(), step_timing=self.step_timer.snapshot(),
                        sleep_level=self.sleep_mode.level,
                        step_efficiency=self.efficiency.snapshot())  # fmt: skip
        if self.connector is None:
            return stats
        c = self.connector.counters
        return replace(stats, kv_tiers=self.connector.stats(), kv_blocks_saved=c.blocks_saved,
                       kv_blocks_loaded=c.blocks_loaded, kv_saves_dropped=c.saves_dropped,
                       kv_lookups_late=c.lookups_late)  # fmt: skip

    def clear_kv_tiers(self) -> int:
        """Delete every block of the KV tiers (POST /kv/clear); returns how many files."""
        return self.connector.clear() if self.connector is not None else 0

    def sleep(self, level: int) -> dict:
        """Free the KV pool (level 2: the weights too) of an idle core (sleep_mode.py)."""
        return self.sleep_mode.sleep(level)

    def wake_up(self) -> dict:
        """Take back what `sleep` freed; the core serves again."""
        return self.sleep_mode.wake_up()

    def rank_reports(self) -> list[dict]:
        """Per tensor-parallel rank: pid, bytes of weights and KV cache (empty without TP)."""
        reports = getattr(self.runner, "reports", None)
        return reports() if reports is not None else []

    def step_timing(self) -> StepTiming:
        """Cumulative phase timings of every step so far (inferd/step_timing.py)."""
        return self.step_timer.snapshot()

    def step_efficiency(self) -> StepEfficiency:
        """Bytes read, FLOPs, MBU and MFU of every step so far (inferd/step_efficiency.py)."""
        return self.efficiency.snapshot()

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


def _weights_identity(path) -> tuple[int, int]:
    """(bytes, mtime) of the weight files: a stored KV block is only as good as the weights
    that computed it (engine/kv_tiers/connector.py `store_identity`)."""
    from pathlib import Path

    from inferd.loader.weight_cache import source_identity

    try:
        return source_identity(Path(path))
    except (OSError, ValueError):
        return (0, 0)
