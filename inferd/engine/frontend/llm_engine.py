"""The engine as one object in the caller's process: the front end's two stages around an engine
core, driven one `step()` at a time.

    add_request: InputProcessor (tokenize, check) ─CoreRequest─▶ EngineCore
    step():      EngineCore.step() ─CoreOutput─▶ OutputProcessor ─▶ RequestOutput
                 (a stop string the output processor finds ends its sample in the core at once)

`LLM` (inferd/llm.py), `inferd generate` and `inferd chat` use it; the server drives the same
parts with the core in its own process (engine/frontend/async_core_client.py). `core_process=True`
puts the core in its own process here too (engine/frontend/remote_core.py, over the `CoreClient`
contract): the same calls, the core stepping on its own meanwhile. It is not thread-safe: served
in-process, the one step loop (core_loop.py) drives it from a thread (async_engine.py).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time

from inferd.config import EngineConfig
from inferd.engine.core.core import EngineCore
from inferd.engine.frontend.input_processor import InputLimits, InputProcessor
from inferd.engine.frontend.output_processor import OutputProcessor
from inferd.engine.kv_tiers.open_tiers import wants_tiers
from inferd.engine.sampling.structured_outputs import GrammarCompilation
from inferd.engine_client import EngineStats, PromptInput, TraceFiles
from inferd.errors import EngineDeadError, InvalidRequest, ModelAsleep
from inferd.multimodal.image_processor import image_preprocessor
from inferd.outputs import EmbeddingRequestOutput, RequestOutput
from inferd.pooling_params import PoolingParams
from inferd.sampling_params import SamplingParams
from inferd.step_efficiency import StepEfficiency
from inferd.step_timing import StepTiming

__all__ = ["EngineStats", "LLMEngine"]

log = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None, core_process: bool = False,
                 **overrides):  # fmt: skip
        config = config or EngineConfig(**overrides)
        if core_process:
            from inferd.engine.frontend.remote_core import ProcessCore

            self.core = core = ProcessCore(config)
        else:
            self.core = core = EngineCore(config)
        self.config, self.setup = config, core.setup
        self.model_config, self.tokenizer = core.model_config, core.tokenizer
        self.max_model_len, self.model_info = core.max_model_len, core.model_info
        limits = InputLimits.of(config, self.model_config.vocab_size, self.max_model_len)
        images = image_preprocessor(self.model_config, config)
        self.inputs = InputProcessor(self.tokenizer, limits, self.model_info.pooling, images)
        self.outputs = OutputProcessor(self.tokenizer, config.stream_interval)
        self.sleep_level = 0  # as the core's last answer to sleep / wake_up said

    # The core's parts, for tests, benchmarks and commands that look inside.
    runner = property(lambda self: self.core.runner)
    kv = property(lambda self: self.core.kv)
    scheduler = property(lambda self: self.core.scheduler)
    executor = property(lambda self: self.core.executor)
    grammars = property(lambda self: self.core.grammars)
    speculation = property(lambda self: self.core.speculation)
    step_timer = property(lambda self: self.core.step_timer)
    efficiency = property(lambda self: self.core.efficiency)  # the steps' EfficiencyMeter
    trace = property(lambda self: self.core.trace)
    dead = property(lambda self: self.core.dead)
    # NOTE: only an in-process core has one (its KV tiers); with core_process=True reading it
    # raises AttributeError, so `getattr(engine, "connector", None)` is None (dashboard_view.py).
    connector = property(lambda self: self.core.connector)

    @property
    def requests(self) -> dict:
        """Unfinished requests by id (the core's)."""
        return self.core.scheduler.requests

    # ---- requests ----------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: PromptInput,
        params: SamplingParams | PoolingParams | None = None,
        arrival_time: float | None = None,
        stream: bool = False,
    ) -> None:
        """Validate and queue a request (PoolingParams: an embedding request, whose one
        output is an EmbeddingRequestOutput). Raises InvalidRequest (nothing queued) on bad
        input, EngineDeadError when the engine can run no more steps. `stream`: an output
        after every step with news, not only the final one."""
        if self.core.dead is not None:
            raise EngineDeadError(self.core.dead)
        if self.sleep_level:  # NOTE: before tokenizing; a core in a process would refuse later
            raise ModelAsleep(f"the model is asleep (level {self.sleep_level}): wake it first")
        if request_id in self.outputs.requests:
            raise InvalidRequest(None, f"request_id {request_id!r} is already in use")
        params = params or SamplingParams()
        request, text = self.inputs.make_request(request_id, prompt, params, arrival_time)
        self.core.add_request(request)
        self.outputs.add_request(request_id, text, request.prompt_token_ids,
                                 request.pooling or params, request.arrival_time,
                                 getattr(params, "max_tokens", None), stream)  # fmt: skip

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now and free its blocks; its final output comes with the next step."""
        return self.core.abort_request(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.outputs.has_unfinished() or self.core.has_unfinished_requests()

    def compile_grammar(self, params: SamplingParams) -> GrammarCompilation | None:
        """Start compiling the request's grammar (any thread; never blocks), or None."""
        return self.core.compile_grammar(params)

    def check_grammar(self, params: SamplingParams, timeout: float | None = None) -> None:
        """Compile the request's grammar now (blocking): raise its InvalidRequest, if any."""
        handle = self.compile_grammar(params)
        if handle is not None:
            concurrent.futures.wait([handle.future], timeout)
            if handle.done():
                handle.check()

    # ---- the step ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput | EmbeddingRequestOutput]:
        results, finishes = self.outputs.process(self.core.step(), time.monotonic())
        for finish in finishes:  # NOTE: before the next step: nothing after the stop runs
            self.core.finish_sample(finish.request_id, finish.index)
        return results

    def shutdown(self) -> None:
        self.core.shutdown()

    def stats(self) -> EngineStats:
        return self.core.stats()

    def step_timing(self) -> StepTiming:
        return self.core.step_timing()

    def step_efficiency(self) -> StepEfficiency | None:
        return self.core.step_efficiency()

    def start_profile(self, directory: str) -> None:
        self.core.start_profile(directory)

    def stop_profile(self) -> TraceFiles:
        return self.core.stop_profile()

    def rank_reports(self) -> list[dict]:
        """Per tensor-parallel rank: pid, bytes of weights and KV cache (empty without TP)."""
        return self.core.rank_reports()

    def clear_kv_tiers(self) -> int:
        """Delete every block of the KV tiers (queued saves are written first, then deleted
        too); returns how many blocks went. InvalidRequest when the engine keeps no tiers: a
        clear that could remove nothing is a mistake to report, not a success."""
        if not wants_tiers(self.config):
            raise InvalidRequest(None, "this engine keeps no KV tiers: configure one with "
                                 "kv_offload_memory=BYTES, or kv_offload_dir=DIR and "
                                 "kv_offload_disk=BYTES")  # fmt: skip
        return self.core.clear_kv_tiers()

    # ---- sleep (engine/core/sleep_mode.py) ----------------------------------------------------
    def sleep(self, level: int = 1) -> dict:
        """Free the KV pool (level 2: the weights too) while no request runs: `{"level",
        "freed_bytes", "rss_before", "rss_after"}` of the core's process. RequestsRunning when
        requests are unfinished (nothing changes); requests added while asleep raise
        ModelAsleep until `wake_up`."""
        answer = self.core.sleep(level)
        self.sleep_level = answer["level"]
        return answer

    def wake_up(self) -> dict:
        """Take back what `sleep` freed: `{"level" (slept at; 0: was awake), "seconds",
        "rss_after"}`."""
        answer = self.core.wake_up()
        self.sleep_level = 0
        return answer

    def is_sleeping(self) -> bool:
        return self.sleep_level > 0
