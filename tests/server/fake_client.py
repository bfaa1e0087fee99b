"""A scripted EngineClient for route tests without a model: replies come from a function of the
prompt, tokens are characters, and every request's prompt and SamplingParams are recorded, so a
test sees exactly what a request field did to what reached the engine."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from inferd.engine.frontend.async_core_client import NO_KV_TIERS
from inferd.engine_client import EngineStats, ModelInfo
from inferd.errors import InvalidRequest
from inferd.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from inferd.sampling_params import RequestOutputKind

VOCAB = 128
BOS, EOS = 1, 2
OFFSET = 32  # token id = ord(char) for printable ASCII (32..126)


class CharTokenizer:
    """One token per printable ASCII character; BOS 1, EOS 2; "<bos>" renders as BOS."""

    chat_template = "fake"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([BOS] if add_special_tokens else []) + [ord(c) for c in text if 32 <= ord(c) < 127]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        special = "" if skip_special_tokens else "<{}>"
        return "".join(chr(i) if i >= OFFSET else special.format(i) for i in ids)

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [chr(i) if i >= OFFSET else f"<{i}>" for i in ids]

    def apply_chat_template(self, messages, add_generation_prompt=True, **kwargs) -> str:
        return self.chat_prompt(messages, add_generation_prompt, tokenize=False, **kwargs)[0]

    def chat_prompt(self, messages, add_generation_prompt=True, *, split_special_tokens=True,
                    chat_template_kwargs=None, tokenize=True, continue_final_message=False,
                    chat_template=None, **kwargs):  # fmt: skip
        """Renders "role:content|" per message (+ "tools:N|" and "gen|"), recording the call."""
        self.last_call = dict(messages=messages, split_special_tokens=split_special_tokens,
                              chat_template_kwargs=chat_template_kwargs,
                              continue_final_message=continue_final_message,
                              chat_template=chat_template, **kwargs)  # fmt: skip
        text = "".join(f"{m['role']}:{m['content']}|" for m in messages)
        if kwargs.get("tools"):
            text = f"tools:{len(kwargs['tools'])}|" + text
        if continue_final_message:
            text = text[:-1]
        elif add_generation_prompt:
            text += "gen|"
        return text, self.encode(text, add_special_tokens=False)


Reply = Callable[[list[int], object, int], str]


class ScriptedClient:
    """EngineClient whose request `i` of sample `k` answers `reply(prompt_ids, params, k)`."""

    def __init__(self, reply: Reply | None = None, cached_tokens: int = 0,
                 kv_tiers: tuple = (), stored_blocks: int = 0):  # fmt: skip
        self.model_info = ModelInfo("fake-model", "Fake Model", 256, VOCAB, "fp_fake")
        self.tokenizer = CharTokenizer()
        self.reply = reply or (lambda ids, params, k: "hello")
        self.cached_tokens = cached_tokens
        self.requests: list[tuple[str, dict, object]] = []  # (id, prompt, params)
        # KV tiers: the TierStats its stats report (empty: a server without tiers, whose clear
        # is refused as the real clients refuse it), and how many blocks a clear removes.
        self.kv_tiers = tuple(kv_tiers)
        self.stored_blocks = stored_blocks
        self.clears = 0

    @property
    def last(self):
        return self.requests[-1]

    def start(self):
        pass

    def stop(self, timeout=30.0):
        pass

    def abort(self, request_id):
        pass

    def health(self):
        return None

    def stats(self):
        return EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0, 0, kv_tiers=self.kv_tiers)

    async def clear_kv_tiers(self) -> int:
        if not self.kv_tiers:
            raise InvalidRequest(None, NO_KV_TIERS)
        self.clears += 1
        removed, self.stored_blocks = self.stored_blocks, 0
        return removed

    def observe_outputs(self, callback):
        pass

    async def add_request(self, request_id, prompt, params, outputs, arrival_time=None):
        ids = list(prompt["prompt_token_ids"])
        params.verify(VOCAB)  # the engine's checks that need the model
        if params.truncate_prompt_tokens is not None:
            ids = ids[-params.truncate_prompt_tokens :]
        if not ids:
            raise InvalidRequest("prompt", "the prompt is empty")
        self.requests.append((request_id, dict(prompt), params))
        samples = []
        for k in range(params.n):
            text = self.reply(ids, params, k)
            tokens = self.tokenizer.encode(text, add_special_tokens=False)
            limit = params.max_tokens or 64
            finish = "stop" if len(tokens) < limit else "length"
            samples.append((tokens[:limit], finish))
        loop = asyncio.get_running_loop()
        loop.call_soon(self._emit, request_id, ids, params, samples, outputs, 1)

    def _emit(self, request_id, ids, params, samples, outputs, upto) -> None:
        longest = max(len(t) for t, _ in samples)
        done = upto >= longest
        completions = []
        # RequestOutputKind.DELTA (every stream): only this step's news, as the engine sends it.
        delta = params.output_kind == RequestOutputKind.DELTA
        for k, (tokens, finish) in enumerate(samples):
            shown = tokens[:upto]
            if delta:
                if len(tokens) < upto and not done:
                    continue  # nothing new in this sample
                shown = tokens[upto - 1 : upto]
            lps = None
            if params.logprobs is not None:
                lps = [{t: Logprob(-0.25, 1)} | {EOS: Logprob(-3.0, 2)} for t in shown]
            completions.append(CompletionOutput(
                k, self.tokenizer.decode(shown), shown, logprobs=lps,
                finish_reason=finish if upto >= len(tokens) and done else None,
            ))  # fmt: skip
        prompt_lps = None
        if params.prompt_logprobs is not None:
            prompt_lps = [None] + [{t: Logprob(-1.0, 1)} for t in ids[1:]]
        out = RequestOutput(request_id, None, ids, completions, done, prompt_lps,
                            RequestMetrics(0.0), num_cached_tokens=self.cached_tokens,
                            delta=delta)  # fmt: skip
        outputs.put_nowait(out)
        if not done:
            asyncio.get_running_loop().call_soon(
                self._emit, request_id, ids, params, samples, outputs, upto + 1
            )
