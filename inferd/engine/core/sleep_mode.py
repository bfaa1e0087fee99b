"""Sleep and wake (vLLM's `POST /sleep`, `POST /wake_up`): an idle engine gives its memory back
without stopping, and takes it again when asked.

    sleep(1)   the KV pool's tensors are freed, and with them the prefix cache (the blocks'
               contents are gone); on a GPU the weights move to host memory
    sleep(2)   the weights are dropped too; waking loads them again through the start-up path
               (a GGUF file's packed blocks come back from the weight cache: a read, not a repack)
    wake_up()  the pool is allocated again, untouched (each block is zeroed on its first use, as
               at start), and the weights come back

Only an idle engine sleeps: a request running or waiting makes `sleep` raise RequestsRunning and
the requests go on untouched (the pool they use is what a sleep frees); while asleep the core
refuses requests (ModelAsleep). The KV tiers (engine/kv_tiers/) are left as they are: after a
wake, prompts load blocks from them as before. Refused with tensor parallelism: the other ranks'
pools and weights are reached only through the step record.

What a sleep frees is measured as the core process's resident memory (VmRSS) before and after.
On CPU the pool is allocated with torch.empty and only the blocks used so far are resident, so
an engine that served little frees little; freed heap pages go back to the OS by malloc_trim.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

import torch

from inferd.engine.core.dashboard_memory import weight_bytes
from inferd.errors import InvalidRequest, ModelAsleep, RequestsRunning
from inferd.memory.snapshot import proc_status
from inferd.memory_trim import trim_now

log = logging.getLogger(__name__)

LEVELS = (1, 2)


def rss_bytes() -> int:
    return proc_status().get("VmRSS", 0)


class SleepMode:
    """The sleep state of one `EngineCore` (engine/core/core.py), which it changes in place: the
    runner's pool and model, the KV manager's bookkeeping, the scheduler's adapter slots."""

    def __init__(self, core):
        self.core = core
        self.level = 0  # 0: awake
        self._had_graphs = False  # CUDA graphs to capture again on waking

    def check_awake(self) -> None:
        if self.level:
            raise ModelAsleep(f"the model is asleep (level {self.level}): POST /wake_up")

    def sleep(self, level: int) -> dict[str, Any]:
        """Free the pool (and the weights at level 2); the answer: the level now, bytes of
        tensors freed, the process's RSS before and after. Sleeping again at the same or a
        lower level changes nothing; from 1 to 2 drops the weights."""
        if level not in LEVELS or isinstance(level, bool):
            raise InvalidRequest("level", f"level must be 1 or 2, got {level!r}")
        core = self.core
        if core.config.tensor_parallel_size > 1:
            raise InvalidRequest(None, "sleep is not supported with tensor parallelism: each "
                                 "rank holds its own KV pool and weights")  # fmt: skip
        busy = len(core.scheduler.requests)
        if busy:
            raise RequestsRunning(f"{busy} request(s) are running or waiting: sleep frees the "
                                  "KV pool they use; retry once they have finished")  # fmt: skip
        before, freed, started = rss_bytes(), 0, time.monotonic()
        runner, device = core.runner, core.setup.device
        if self.level == 0:
            self._had_graphs = getattr(runner, "graphs", None) is not None
            runner.graphs = None  # they captured the pool's addresses, which go now
            freed += runner.free_kv_pool()
            decoder = getattr(runner.model, "cpu_decoder", None)
            if decoder is not None:  # NOTE: it keeps the pool's list between steps
                decoder.forget_kv_caches()
            core.kv.forget_contents()  # nothing cached; blocks zeroed on first use again
            if device.type == "cuda" and level == 1:
                freed += weight_bytes(runner.model)
                runner.model.to("cpu")  # host memory; moved back on waking
        if level == 2 and self.level < 2:
            if runner.model is not None and (device.type != "cuda" or self.level == 0):
                freed += weight_bytes(runner.model)
            runner.model = None
        self.level = max(self.level, level)
        _give_back(device)
        after = rss_bytes()
        log.warning("engine asleep (level %d): %.1f MiB of tensors freed, RSS %.1f → %.1f MiB "
                    "in %.2f s", self.level, freed / 2**20, before / 2**20, after / 2**20,
                    time.monotonic() - started)  # fmt: skip
        return {"level": self.level, "freed_bytes": freed, "rss_before": before,
                "rss_after": after}  # fmt: skip

    def wake_up(self) -> dict[str, Any]:
        """Take the memory back; the answer: the level it slept at (0: it was awake), the
        seconds it took, the RSS after."""
        level, started = self.level, time.monotonic()
        if level == 0:
            return {"level": 0, "seconds": 0.0, "rss_after": rss_bytes()}
        core = self.core
        runner, setup = core.runner, core.setup
        if runner.model is None:
            runner.model = self._reload()
        elif setup.device.type == "cuda":
            runner.model.to(setup.device)
        runner.allocate_kv_pool()
        if self._had_graphs:
            from inferd.engine.execution.cuda_graphs import CUDAGraphDecoder

            graphs = CUDAGraphDecoder(runner, setup.max_num_seqs, setup.max_model_len)
            graphs.capture()
            runner.graphs = graphs
        self.level = 0
        seconds = time.monotonic() - started
        log.warning("engine awake (slept at level %d) in %.2f s", level, seconds)
        return {"level": level, "seconds": round(seconds, 4), "rss_after": rss_bytes()}

    def _reload(self):
        """The weights as start-up loads them (engine/execution/model_setup.py), from the
        checkpoint already open; LoRA slots are made again, empty."""
        from inferd.engine.execution.model_setup import load_rank_model
        from inferd.layers.lora import attach_lora

        core = self.core
        config = core.config
        setup = core.setup
        model, _, _, _ = load_rank_model(config, setup.device, checkpoint=setup.checkpoint)
        if config.enable_lora:
            attach_lora(model, config.max_loras, config.max_lora_rank)
            core.scheduler.adapters.clear()  # the new slots hold no adapter yet
        return model


def _give_back(device: torch.device) -> None:
    """Return what the freed tensors held: Python's cycles first (a model is full of them),
    then glibc's free heap pages (the engine keeps freed memory in its heap:
    platform.keep_freed_memory_in_heap), and the CUDA allocator's cached blocks."""
    gc.collect()
    trim_now()
    if device.type == "cuda":
        torch.cuda.empty_cache()
