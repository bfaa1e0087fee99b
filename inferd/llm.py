"""The offline API, with vLLM's names so scripts carry over:

llm = LLM()                                   # the embedded Gemma 3 270M
outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
print(outs[0].outputs[0].text)
vecs = llm.embed(["Hello"])                   # vecs[0].outputs.embedding: unit-length floats
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from inferd.config import EngineConfig
from inferd.engine.frontend.llm_engine import LLMEngine
from inferd.engine_client import TraceFiles
from inferd.errors import InvalidRequest
from inferd.loader.catalog import with_engine_defaults
from inferd.lora_request import LoRARequest
from inferd.memory_trim import malloc_trim
from inferd.multimodal.image_parts import split_images
from inferd.outputs import EmbeddingRequestOutput, RequestOutput
from inferd.pooling_params import PoolingParams
from inferd.sampling_params import SamplingParams
from inferd.step_efficiency import StepEfficiency
from inferd.step_timing import StepTiming
from inferd.tools.templates import prepare_messages

PromptType = str | list[int] | dict


# NOTE: the offline twin of AsyncEngine's trim on going idle. Loading (the tokenizer's JSON,
# the weights' load buffers) and a big batch (its steps' activations, logits, the C layer's
# scratch) free far more than they keep, but glibc holds freed pages in its arenas; handing
# them back after each is a few milliseconds and tens of MiB of RSS (scripts/rss_batch32.py).
_TRIM = malloc_trim()


def _return_free_memory() -> None:
    if _TRIM is not None:
        _TRIM(0)


class LLM:
    def __init__(
        self,
        model: str | None = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        kv_cache_memory: int | None = None,
        enable_prefix_caching: bool = True,
        seed: int = 0,
        engine_core_process: bool = False,
        **kwargs,
    ):
        """`engine_core_process`: run the engine core (scheduler, model, sampler) in its own
        process, as `inferd serve` does; by default it runs in this one. The other arguments
        are EngineConfig's (vLLM's names)."""
        config = EngineConfig(
            model=model,
            dtype=dtype,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            kv_cache_memory=kv_cache_memory,
            enable_prefix_caching=enable_prefix_caching,
            seed=seed,
            **kwargs,
        )
        # A short name (`LLM(model="smollm2-135m-instruct")`) brings its settings along.
        self.engine = LLMEngine(with_engine_defaults(config), core_process=engine_core_process)
        self._ids = itertools.count()
        _return_free_memory()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def shutdown(self) -> None:
        """Stop tensor-parallel workers now (they also stop when this process exits)."""
        self.engine.shutdown()

    def rank_reports(self) -> list[dict]:
        """Per tensor-parallel rank, measured on that rank: rank, pid, bytes of weights and of
        KV cache held. Empty without tensor parallelism."""
        return self.engine.rank_reports()

    def clear_kv_tiers(self) -> int:
        """Delete every block the KV tiers hold (kv_offload_memory, kv_offload_dir): the
        prompts that follow find none of them. Returns how many blocks went; InvalidRequest
        (a ValueError) when this engine keeps no tiers."""
        return self.engine.clear_kv_tiers()

    def sleep(self, level: int = 1) -> dict:
        """vLLM's: free the KV pool (level 2: the weights too) until `wake_up`; the prefix
        cache goes with the pool. Returns {"level", "freed_bytes", "rss_before", "rss_after"}
        (docs/server.md, Sleep and wake)."""
        return self.engine.sleep(level)

    def wake_up(self) -> dict:
        """Take back what `sleep` freed: {"level" it slept at, "seconds", "rss_after"}."""
        return self.engine.wake_up()

    def is_sleeping(self) -> bool:
        return self.engine.is_sleeping()

    # ---- where the time and memory go (docs/profiling.md) ------------------------------------
    def start_profile(self, directory: str) -> None:
        """Trace the engine's steps with torch.profiler until `stop_profile` (vLLM's name)."""
        self.engine.start_profile(directory)

    def stop_profile(self) -> TraceFiles:
        """End the trace; its Chrome-trace JSON and top-ops table are written then."""
        return self.engine.stop_profile()

    def step_timing(self) -> StepTiming:
        """Cumulative time per step phase (`.minus(earlier)` for a span of work)."""
        return self.engine.step_timing()

    def step_efficiency(self) -> StepEfficiency | None:
        """Cumulative bytes read, FLOPs, MBU and MFU of the steps (`.minus(earlier)` for a
        span); None when the engine does not count them (docs/profiling.md)."""
        return self.engine.step_efficiency()

    def kv_cache_bytes(self) -> int:
        """Bytes of the KV pool this process allocated."""
        if self.engine.setup is None:
            raise ValueError(
                "kv_cache_bytes: the KV pool is in the engine core's process "
                "(engine_core_process=True); rank_reports() measures it there"
            )
        return self.engine.runner.kv_cache_bytes()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in the order of the prompts.
        All prompts are validated before any is queued, so one bad prompt queues nothing.
        `lora_request`: the LoRA adapter every prompt runs under, or one per prompt (None: the
        base model); the engine needs enable_lora=True. `priority` (vLLM's): one per prompt,
        lower first; nonzero values need scheduling_policy="priority"."""
        prompts = _prompt_list(prompts)
        params = _params_per_prompt(sampling_params or SamplingParams(), SamplingParams,
                                    len(prompts))  # fmt: skip
        if lora_request is not None:
            prompts = _with_adapters(prompts, lora_request)
        if priority is not None:
            prompts = _with_priorities(prompts, priority)
        for p in params:  # a bad grammar fails here, before anything is queued
            self.engine.check_grammar(p)
        return self._run(self._queue(prompts, params), use_tqdm)

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[EmbeddingRequestOutput]:
        """The embedding of every prompt (`.outputs.embedding`), in the order of the prompts:
        its final hidden states pooled as `pooling_params` say (vLLM's PoolingParams; unset
        fields: the model's defaults, `ModelInfo.pooling`). The prompts are batched with
        whatever else runs, like any prefill. All are checked before any is queued."""
        prompts = _prompt_list(prompts)
        params = _params_per_prompt(pooling_params or PoolingParams(), PoolingParams,
                                    len(prompts))  # fmt: skip
        return self._run(self._queue(prompts, params), use_tqdm)

    def _queue(self, prompts: list, params: list) -> list[str]:
        """Add every prompt; if one is refused, take back those added and raise."""
        ids = []
        try:
            for prompt, p in zip(prompts, params):
                request_id = f"offline-{next(self._ids)}"
                self.engine.add_request(request_id, prompt, p)
                ids.append(request_id)
        except ValueError:
            for request_id in ids:
                self.engine.abort_request(request_id)
            self.engine.step()  # drain the aborted outputs
            raise
        return ids

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
        split_special_tokens: bool = True,
    ) -> list[RequestOutput]:
        """Render each conversation with the chat template, then generate. Special-token
        strings typed into messages stay text (`split_special_tokens=False` lets a trusted
        caller write them); `tools` (OpenAI's shape) go to the template, which must show them;
        `continue_final_message` continues the final (assistant) message instead of starting
        a new turn."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tok = self.engine.tokenizer
        from inferd.tokenizer.chat_template import ChatTemplate  # Jinja only when chatting
        from inferd.tokenizer.template_files import load_chat_template

        template = ChatTemplate(load_chat_template(chat_template)) if chat_template else None
        extra = {} if tools is None else {"tools": tools}
        prompts = []
        for conv in conversations:
            # image parts (data: URLs, PIL images) → {"type": "image"} for the template
            conv, images = split_images(conv)
            text, ids = tok.chat_prompt(
                prepare_messages(conv) if tools is not None else conv,
                add_generation_prompt,
                split_special_tokens=split_special_tokens,
                chat_template_kwargs=chat_template_kwargs,
                continue_final_message=continue_final_message,
                chat_template=template,
                **extra,
            )
            prompt = {"prompt": text, "prompt_token_ids": ids}
            prompts.append({**prompt, "multi_modal_data": {"image": images}} if images else prompt)
        return self.generate(prompts, sampling_params, use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool) -> list:
        done: dict[str, RequestOutput | EmbeddingRequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(ids), desc="Processed prompts", unit="req", leave=False)
        wanted = set(ids)
        try:
            while len(done) < len(ids) and self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished and out.request_id in wanted:
                        if out.error:
                            raise RuntimeError(f"request {out.request_id} failed: {out.error}")
                        done[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
        except BaseException:  # failure or Ctrl-C: leave no request behind in the engine
            for request_id in wanted - done.keys():
                self.engine.abort_request(request_id)
            self.engine.step()
            raise
        finally:
            if bar is not None:
                bar.close()
            _return_free_memory()
        return [done[i] for i in ids]


def _prompt_list(prompts) -> list:
    """One prompt (a string, a dict, a list of token ids) or a sequence of them, as a list."""
    if isinstance(prompts, str | dict) or (
        isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
    ):
        return [prompts]
    return list(prompts)


def _params_per_prompt(params, kind: type, n: int) -> list:
    """One params object for all prompts, or one per prompt."""
    if isinstance(params, kind):
        return [params] * n
    if not isinstance(params, Sequence):
        raise ValueError(f"expected {kind.__name__} or one per prompt, got "
                         f"{type(params).__name__}")  # fmt: skip
    params = list(params)
    if len(params) != n:
        raise ValueError(f"got {len(params)} {kind.__name__} for {n} prompts; pass one, or one "
                         "per prompt")  # fmt: skip
    bad = next((p for p in params if not isinstance(p, kind)), None)
    if bad is not None:
        raise ValueError(f"expected {kind.__name__}, got {type(bad).__name__}")
    return params


def _as_dict(prompt) -> dict:
    """A prompt as the dict form the input processor reads (text, token ids, or a dict)."""
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if isinstance(prompt, list | tuple):
        return {"prompt_token_ids": list(prompt)}
    return dict(prompt) if isinstance(prompt, dict) else prompt


def _with_priorities(prompts: list, priority) -> list:
    """Each prompt as a dict with its priority (vLLM takes exactly one per prompt)."""
    if isinstance(priority, int) or len(priority) != len(prompts):
        count = "an integer" if isinstance(priority, int) else f"{len(priority)} priorities"
        raise InvalidRequest("priority", f"priority must be a list of one integer per prompt, "
                                         f"got {count} for {len(prompts)} prompts")  # fmt: skip
    out = [_as_dict(p) for p in prompts]  # anything else: the input processor's error
    return [{**d, "priority": v} if isinstance(d, dict) else d for d, v in zip(out, priority)]


def _with_adapters(prompts: list, lora_request) -> list:
    """Each prompt as a dict naming its adapter (what the input processor reads)."""
    if isinstance(lora_request, LoRARequest):
        adapters = [lora_request] * len(prompts)
    else:
        adapters = list(lora_request)
        if len(adapters) != len(prompts):
            message = f"got {len(adapters)} lora_requests for {len(prompts)} prompts"
            raise InvalidRequest("lora_request", message + "; pass one, or one per prompt")
    out = []
    for prompt, lora in zip(prompts, adapters):
        if isinstance(prompt, str):
            prompt = {"prompt": prompt}
        elif isinstance(prompt, list | tuple):
            prompt = {"prompt_token_ids": list(prompt)}
        elif isinstance(prompt, dict):
            prompt = dict(prompt)
        out.append(prompt if lora is None else {**prompt, "lora_request": lora})
    return out
