"""From what a caller submits to a `Request` the scheduler can run: tokenize the prompt, check it
and its SamplingParams against the model and the engine's limits (raising typed errors, with
nothing queued), and build its n samples, each with its own generator and detokenizer."""

from __future__ import annotations

import itertools
import time

import torch

from inferd.engine.request import Request, Sequence
from inferd.engine.sampler import make_generator
from inferd.engine_client import PromptInput
from inferd.errors import ContextTooLong, InvalidRequest
from inferd.outputs import RequestMetrics
from inferd.sampling_params import MAX_LOGPROBS, MAX_STOP_STRING_LENGTH, SamplingParams
from inferd.tokenizer import IncrementalDetokenizer


class InputProcessor:
    def __init__(self, tokenizer, vocab_size: int, max_model_len: int, max_n: int,
                 max_stop_strings: int, device: torch.device, *,
                 max_stop_string_length: int = MAX_STOP_STRING_LENGTH,
                 max_logprobs: int = MAX_LOGPROBS, grammars=None):  # fmt: skip
        self.tokenizer, self.vocab_size, self.max_model_len = tokenizer, vocab_size, max_model_len
        self.max_n, self.max_stop_strings, self.device = max_n, max_stop_strings, device
        self.max_stop_string_length, self.max_logprobs = max_stop_string_length, max_logprobs
        self.grammars = grammars  # StructuredOutputs: compiles the request's grammar
        self._seq_ids = itertools.count()

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

    def make_request(self, request_id: str, prompt: PromptInput, params: SamplingParams,
                     arrival_time: float | None, stream: bool) -> Request:  # fmt: skip
        """A checked request with its samples; raises InvalidRequest (or ContextTooLong)."""
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
        params.verify(vocab, self.max_n, self.max_stop_strings, self.max_stop_string_length,
                      self.max_logprobs)  # fmt: skip
        if params.truncate_prompt_tokens is not None:
            keep = params.truncate_prompt_tokens
            keep = self.max_model_len if keep == -1 else keep
            if len(ids) > keep:  # the prompt's text no longer describes it
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
        salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
        if salt is not None and (not isinstance(salt, str) or not salt):
            raise InvalidRequest("cache_salt", "cache_salt must be a non-empty string if given")
        metrics = RequestMetrics(arrival_time=arrival_time or time.monotonic())
        metrics.num_prompt_tokens = len(ids)
        req = Request(request_id, text, ids, params, metrics, max_tokens, forked=params.n == 1,
                      stream=stream, cache_salt=salt)  # fmt: skip
        samples = [self._new_sequence(req, i) for i in range(params.n)]
        req.sequences, req.forks = samples[:1], samples[1:]
        if params.prompt_logprobs is not None:
            req.prompt_logprobs = [None]  # nothing predicts the first prompt token
        if params.structured_outputs is not None:
            if self.grammars is None:
                raise InvalidRequest("structured_outputs", "this engine has no grammar support")
            req.grammar = self.grammars.submit(params.structured_outputs)
        return req

    def _new_sequence(self, req: Request, index: int) -> Sequence:
        generator = None
        if req.params.seed is not None:
            # Sample i of a seeded request uses seed + i: reproducible, and distinct samples.
            generator = make_generator(req.params.seed + index, self.device)
        seq = Sequence(next(self._seq_ids), req, index, list(req.prompt_token_ids),
                       len(req.prompt_token_ids), generator=generator)  # fmt: skip
        seq.detokenizer = IncrementalDetokenizer(
            self.tokenizer, req.prompt_token_ids, req.params.skip_special_tokens
        )
        return seq
