"""The front end's first stage: from what a caller submits to a `CoreRequest` the engine core
can run. Tokenize the prompt, check it and its SamplingParams against the model and the engine's
limits (raising typed errors, with nothing queued), resolve max_tokens. What the core needs is
token ids and params; the prompt's text stays here, with the output processor."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from inferd.engine.core.core_output import CoreRequest
from inferd.engine_client import PromptInput
from inferd.errors import ContextTooLong, InvalidRequest
from inferd.loader.lora_adapter import read_adapter_config
from inferd.lora_request import LoRARequest
from inferd.multimodal.image_processor import ImagePreprocessor, shifted
from inferd.pooling_params import PoolerConfig, PoolingParams
from inferd.sampling_params import MAX_LOGPROBS, MAX_STOP_STRING_LENGTH, SamplingParams


@dataclass(frozen=True)
class InputLimits:
    """What the engine accepts (EngineConfig's limits, and max_model_len as the core set it)."""

    vocab_size: int
    max_model_len: int
    max_n: int = 128
    max_stop_strings: int = 16
    max_stop_string_length: int = MAX_STOP_STRING_LENGTH
    max_logprobs: int = MAX_LOGPROBS
    max_lora_rank: int | None = None  # None: LoRA is not enabled
    scheduling_policy: str = "fcfs"  # under fcfs a request's priority must be 0

    @classmethod
    def of(cls, config, vocab_size: int, max_model_len: int) -> InputLimits:
        rank = config.max_lora_rank if config.enable_lora else None
        return cls(vocab_size, max_model_len, config.max_n, config.max_stop_strings,
                   config.max_stop_string_length, config.max_logprobs, rank,
                   config.scheduling_policy)  # fmt: skip


class InputProcessor:
    def __init__(self, tokenizer, limits: InputLimits, pooler: PoolerConfig | None = None,
                 images: ImagePreprocessor | None = None):  # fmt: skip
        """`pooler`: how the model makes embeddings (ModelInfo.pooling); None: it makes none.
        `images`: a vision-language model's preprocessing; None: the model reads text only."""
        self.tokenizer, self.limits, self.pooler = tokenizer, limits, pooler
        self.images = images
        self.vocab_size, self.max_model_len = limits.vocab_size, limits.max_model_len

    def tokenize_prompt(self, prompt: PromptInput) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise InvalidRequest("prompt", "a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, list | tuple):
            return None, list(prompt)
        raise InvalidRequest(
            "prompt",
            f"prompt must be a string, a list of token ids or a dict, got {type(prompt).__name__}",
        )

    def make_request(
        self,
        request_id: str,
        prompt: PromptInput,
        params: SamplingParams | PoolingParams,
        arrival_time: float | None = None,
    ) -> tuple[CoreRequest, str | None]:
        """(the checked request, its prompt text if known); raises InvalidRequest (or
        ContextTooLong). PoolingParams make an embedding request."""
        text, ids = self._prompt_ids(prompt)
        ids, images = self.images_of(prompt, ids)
        if images and not isinstance(params, SamplingParams):
            raise InvalidRequest("multi_modal_data", "images are for generation only: an "
                                 "embedding request takes text")  # fmt: skip
        if isinstance(params, PoolingParams):
            return self._pooling_request(request_id, prompt, ids, params, arrival_time), text
        if not isinstance(params, SamplingParams):
            raise InvalidRequest(None, f"params must be SamplingParams or PoolingParams, got "
                                       f"{type(params).__name__}")  # fmt: skip
        vocab = self.vocab_size
        lim = self.limits
        params.verify(vocab, lim.max_n, lim.max_stop_strings, lim.max_stop_string_length,
                      lim.max_logprobs)  # fmt: skip
        if params.truncate_prompt_tokens is not None:
            keep = params.truncate_prompt_tokens
            keep = self.max_model_len if keep == -1 else keep
            if len(ids) > keep:  # the prompt's text no longer describes it
                images = shifted(images, len(ids) - keep)
                text, ids = None, ids[-keep:]
        room = self.max_model_len - len(ids)
        if room < 1:
            raise ContextTooLong(
                "prompt",
                f"the prompt has {len(ids)} tokens, but max_model_len is {self.max_model_len}: "
                "no room is left to generate",
            )
        max_tokens = params.max_tokens if params.max_tokens is not None else room
        if len(ids) + max_tokens > self.max_model_len:
            raise ContextTooLong(
                "max_tokens",
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) = "
                f"{len(ids) + max_tokens} exceeds max_model_len ({self.max_model_len})",
            )
        if params.min_tokens > max_tokens:  # max_tokens unset: the room the context leaves
            raise ContextTooLong(
                "min_tokens",
                f"min_tokens ({params.min_tokens}) exceeds the {max_tokens} tokens the context "
                f"leaves after the prompt ({len(ids)} tokens, max_model_len {self.max_model_len})",
            )
        arrival, lora = arrival_time or time.monotonic(), self.lora_of(prompt)
        return CoreRequest(request_id, ids, _for_core(params, vocab), max_tokens, arrival,
                           _cache_salt(prompt), lora_request=lora,
                           priority=self.priority_of(prompt),
                           background=_background(prompt), images=images), text  # fmt: skip

    def _prompt_ids(self, prompt: PromptInput) -> tuple[str | None, list[int]]:
        """The prompt's text and token ids, checked: not empty, every id in the vocabulary."""
        text, ids = self.tokenize_prompt(prompt)
        vocab = self.vocab_size
        if not ids:
            message = "the prompt is empty: it must contain at least one token"
            raise InvalidRequest("prompt", message)
        bad = next((t for t in ids if not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequest(
                "prompt", f"prompt token id {bad!r} is outside the vocabulary [0, {vocab})"
            )
        return text, ids

    def _pooling_request(self, request_id: str, prompt: PromptInput, ids: list[int],
                         params: PoolingParams,
                         arrival_time: float | None) -> CoreRequest:  # fmt: skip
        """An embedding request: its params resolved against the model's pooling, its prompt
        within the context (it needs no room to generate)."""
        resolved = params.resolve(self.pooler)
        if len(ids) > self.max_model_len:
            raise ContextTooLong(
                "input",
                f"the input has {len(ids)} tokens, but max_model_len is {self.max_model_len}",
            )
        # NOTE: SamplingParams' defaults (n = 1, no logprobs) are what the scheduler reads of a
        # request; an embedding request samples nothing, so they are never applied.
        return CoreRequest(request_id, ids, SamplingParams(), 0,
                           arrival_time or time.monotonic(), _cache_salt(prompt), resolved,
                           self.lora_of(prompt), self.priority_of(prompt),
                           _background(prompt))  # fmt: skip

    def images_of(self, prompt: PromptInput, ids: list[int]) -> tuple[list[int], list]:
        """(the prompt's ids with image placeholders expanded, its ImageInput records) from a
        dict's "multi_modal_data" {"image": one image or a list} (vLLM's spelling; an image is
        bytes or a PIL image)."""
        data = prompt.get("multi_modal_data") if isinstance(prompt, dict) else None
        if data is None:
            if self.images is None:
                return ids, []
            return self.images.expand(ids, [], "multi_modal_data.image")
        if not isinstance(data, dict) or set(data) - {"image"}:
            raise InvalidRequest("multi_modal_data", "multi_modal_data must be a dict with an "
                                 "'image' entry (other modalities are not supported)")  # fmt: skip
        if self.images is None:
            raise InvalidRequest("multi_modal_data.image", "this model reads text only: it "
                                 "takes no images")  # fmt: skip
        images = data.get("image")
        images = list(images) if isinstance(images, list | tuple) else [images]
        return self.images.expand(ids, images, "multi_modal_data.image")

    def lora_of(self, prompt: PromptInput) -> LoRARequest | None:
        """The prompt's adapter (a dict's "lora_request"), its config checked now so that a bad
        adapter is the caller's error, not a failed step."""
        value = prompt.get("lora_request") if isinstance(prompt, dict) else None
        if value is None:
            return None
        lora = LoRARequest.of(value)
        if self.limits.max_lora_rank is None:
            raise InvalidRequest("lora_request", "this engine serves no LoRA adapters: start it "
                                 "with enable_lora=True (inferd serve --enable-lora)")  # fmt: skip
        read_adapter_config(lora.lora_path, self.limits.max_lora_rank)
        return lora

    def priority_of(self, prompt: PromptInput) -> int:
        """The prompt's priority (a dict's "priority"; vLLM's meaning: lower runs first), 0
        when not given. Any other value needs the priority policy: under fcfs it would be
        silently ignored, so it is refused, naming the flag (as vLLM does)."""
        value = prompt.get("priority", 0) if isinstance(prompt, dict) else 0
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequest("priority", f"priority must be an integer, got {value!r}")
        if not -(2**63) <= value < 2**63:  # the wire's integers
            raise InvalidRequest("priority", f"priority {value} is outside the 64-bit range")
        if value != 0 and self.limits.scheduling_policy != "priority":
            raise InvalidRequest(
                "priority",
                f"priority={value} needs the priority scheduling policy; this server schedules "
                f"{self.limits.scheduling_policy} (start it with --scheduling-policy priority, "
                "or LLM(scheduling_policy='priority'))",
            )
        return value


def _background(prompt: PromptInput) -> bool:
    """Whether the prompt runs in the background lane (a dict's "background": what a batch's
    lines are, engine/scheduling/background_lane.py)."""
    value = prompt.get("background", False) if isinstance(prompt, dict) else False
    if not isinstance(value, bool):
        raise InvalidRequest("background", f"background must be true or false, got {value!r}")
    return value


def _cache_salt(prompt: PromptInput) -> str | None:
    salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise InvalidRequest("cache_salt", "cache_salt must be a non-empty string if given")
    return salt


def _for_core(params: SamplingParams, vocab: int) -> SamplingParams:
    """The params as the core needs them, every number in 64 bits (the wire's integers): a seed
    is taken modulo 2**64 (the generator does that anyway, seed + i included), a top_k of the
    vocabulary or more means no top-k, and the prompt was truncated here already."""
    seed, top_k = params.seed, params.top_k
    fits = (seed is None or 0 <= seed < 2**64) and top_k <= vocab
    if fits and params.truncate_prompt_tokens is None:
        return params
    return dataclasses.replace(params, seed=None if seed is None else seed % 2**64,
                               top_k=min(top_k, vocab), truncate_prompt_tokens=None)  # fmt: skip
