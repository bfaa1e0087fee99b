"""llama.cpp's `POST /infill`: code completion between a prefix and a suffix, the route editor
plugins (llama.vim, llama.vscode) and some IDE clients call.

The body takes llama.cpp's fields `input_prefix`, `input_suffix`, `input_extra` (context files,
`[{"filename", "text", "time"}]`), `prompt` (text the middle starts with), `n_predict` (its name
for max_tokens; -1: up to the context; 0: the prompt only, to fill the prefix cache),
`cache_prompt` (true only: inferd's prefix cache always reuses what it can), `stream`, and what
the plugins send with every request: `samplers` (the chain, where inferd can reproduce it),
`n_indent`, `t_max_prompt_ms`, `t_max_predict_ms`, `response_fields`, `id_slot` (-1 or 0) and
`n_cmpl` (1); plus the sampling and structured-output fields every generation route takes
(vLLM's names). Anything else is a 400 naming it. The prompt is built from the model's FIM
tokens (server/generation/infill_prompt.py); a model without them is a 400.

The answer has llama.cpp's /completion shape: `content`, `stop`, `stop_type` (`eos`, `word`,
`limit`), `stopping_word`, the token counts and `timings`; streamed, one `data: {"content",
"stop": false}` event per step and a last one with `stop: true` and the counts, without a
`[DONE]` line (llama.cpp's own stream has none). Admission and `--api-key` are those of every
generation route.

The stop rules that llama.cpp applies to the text (`n_indent`, `t_max_predict_ms`) and the
prompt's time limit are applied here, as each step's text arrives: the route then aborts the
engine request and answers with what it has, `stop_type: "limit"` (llama.cpp's type for both).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import Field

from inferd.errors import InvalidRequest
from inferd.outputs import RequestOutput
from inferd.sampling_params import RequestOutputKind, SamplingParams
from inferd.server.extra.infill_rules import check_samplers, indent_cut, indent_resume, pick_fields
from inferd.server.generation.infill_prompt import ContextFile, infill_ids, model_fim
from inferd.server.generation.prompts import checked_text, salted
from inferd.server.generation.request_params import sampling_params
from inferd.server.generation.serving import RequestGroup, abandon_when_gone, arrival_now
from inferd.server.generation.streaming import guarded
from inferd.server.http.sse import encode_event, error_event, sse_response
from inferd.server.openai.protocol import Body, GenerationFields
from inferd.server.openai.shapes import new_id
from inferd.server.state import get_state, note_user

router = APIRouter()


class InfillFile(Body):
    filename: str = "tmp"  # llama.cpp's default for a file given without a name
    text: str = ""
    # When the plugin took the chunk (llama.vim: a reltime() pair, llama.vscode: Date.now()):
    # the plugin's own bookkeeping for evicting old chunks. llama.cpp reads only filename and
    # text, and no server meaning is defined for it; it is accepted so those bodies pass.
    time: Any = None


class InfillRequest(GenerationFields):
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[InfillFile] = Field(default_factory=list)
    prompt: str = ""
    n_predict: int = -1  # llama.cpp's default: until the model stops or the context is full
    cache_prompt: bool = True
    stream: bool = False
    n: int = Field(default=1, ge=1, le=1)  # llama.cpp's answer holds one completion
    samplers: list[str] | None = None  # None: inferd's own order (infill_rules.py)
    n_indent: int = Field(default=0, ge=0)
    t_max_prompt_ms: int = -1  # <= 0: no limit (llama.cpp's default -1)
    t_max_predict_ms: int = -1
    response_fields: list[str] = Field(default_factory=list)
    id_slot: int = -1
    n_cmpl: int = 1


def infill_params(body: InfillRequest) -> SamplingParams:
    if not body.cache_prompt:
        raise InvalidRequest(
            "cache_prompt",
            "cache_prompt: false is not supported (the prefix cache reuses what it can for every "
            "request; start the server with --no-enable-prefix-caching to turn it off)",
        )
    if body.truncate_prompt_tokens is not None:
        raise InvalidRequest(
            "truncate_prompt_tokens",
            "truncate_prompt_tokens is not supported on /infill: cutting the prompt's front would "
            "drop its fill-in-the-middle tokens",
        )
    if body.n_predict < -1:
        raise InvalidRequest(
            "n_predict", f"n_predict must be -1 (no limit), 0 (the prompt only) or >= 1, got "
            f"{body.n_predict}",
        )  # fmt: skip
    # inferd has no slots: one prefix cache serves every request, so a request reuses what any
    # earlier one computed, as llama.cpp's slot 0 does on a one-slot server; plugins send 0.
    if body.id_slot not in (-1, 0):
        raise InvalidRequest(
            "id_slot",
            f"id_slot {body.id_slot} is not supported: inferd has no slots (one prefix cache is "
            "shared by every request); send -1 or 0",
        )
    if body.n_cmpl != 1:
        raise InvalidRequest(
            "n_cmpl",
            f"n_cmpl {body.n_cmpl} is not supported on /infill: it answers one completion "
            "(send n_cmpl 1)",
        )
    # n_predict 0 asks for the prompt only (plugins send it to put context files into the
    # cache): the engine computes the prompt and one token, which the answer leaves out.
    params = sampling_params(body, {-1: None, 0: 1}.get(body.n_predict, body.n_predict))
    check_samplers(body.samplers, params, samples=body.n_predict != 0)
    # The route reads each step's news whether it streams or not: the stop rules look at the
    # text as it grows, and the answer is built from the pieces.
    params.output_kind = RequestOutputKind.DELTA
    return params


@router.post("/infill")
@abandon_when_gone
async def infill(body: InfillRequest, request: Request) -> Response:
    arrival = arrival_now()
    state = get_state(request)
    model = state.check_model(body.model)
    note_user(request, body)
    fim = model_fim(state.tokenizer, "input_prefix")
    params = infill_params(body)
    files = [ContextFile(f.filename, checked_text(f"input_extra[{i}].text", f.text))
             for i, f in enumerate(body.input_extra)]  # fmt: skip
    texts = [body.input_prefix, body.input_suffix, body.prompt, *(f.text for f in files)]
    group = state.admit(request, ["".join(texts) or " "], 1, param="input_prefix")

    def build() -> list[dict[str, Any]]:
        ids = infill_ids(state.tokenizer, fim, checked_text("input_prefix", body.input_prefix),
                         checked_text("input_suffix", body.input_suffix),
                         checked_text("prompt", body.prompt), files)  # fmt: skip
        return [{"prompt": None, "prompt_token_ids": ids}]

    prompts = salted(await group.tokenize(build), body.cache_salt)
    prompts = state.with_adapter(prompts, body.model)
    await group.submit(new_id("infill"), prompts, params, arrival)
    run = _Run(group, body, model, arrival)
    if body.stream:
        return sse_response(guarded(group, request, run.events(), _failed))
    try:
        async for _ in run.steps():
            pass
    finally:
        group.abort()
    return JSONResponse(run.final(run.text))


def _failed(error: Any) -> list[bytes]:
    return [error_event(error.message, code=error.code)]


class _Run:
    """One /infill request's generation: the text so far, read step by step, and the rules that
    end it early (llama.cpp's n_indent, t_max_predict_ms and t_max_prompt_ms)."""

    def __init__(self, group: RequestGroup, body: InfillRequest, model: str, arrival: float):
        self.group, self.body, self.model, self.arrival = group, body, model, arrival
        self.text = ""
        self.tokens = 0
        self.last: RequestOutput | None = None
        self.limited = False  # a rule here ended it: stop_type "limit"
        self.first_token: float | None = None  # this route's clock, when the first token came
        self.checked = 0  # where n_indent's next check starts

    async def steps(self) -> AsyncIterator[str]:
        """Each step's new text (what the answer gains), until the request ends."""
        outputs = self.group.outputs()
        deadline = None
        if self.body.t_max_prompt_ms > 0:
            deadline = self.arrival + self.body.t_max_prompt_ms / 1000
        while True:
            try:
                if deadline is not None and self.first_token is None:
                    left = max(deadline - time.monotonic(), 0.0)
                    out = await asyncio.wait_for(anext(outputs), left)
                else:
                    out = await anext(outputs)
            except StopAsyncIteration:
                return
            except TimeoutError:
                # t_max_prompt_ms: no token came in time: the answer is empty and sent now,
                # while the prompt is computed to its end all the same (llama.vim's warm-up
                # sends 1 ms and wants its context files in the prefix cache). llama.cpp
                # declares the field without applying it; this is inferd's meaning.
                self.limited = True
                self.group.finish_prompts()
                return
            self.last = out
            sample = out.outputs[0] if out.outputs else None
            if sample is None:
                continue
            if self.first_token is None and sample.token_ids:
                self.first_token = time.monotonic()
            self.tokens += len(sample.token_ids)
            piece = sample.text
            if self.body.n_predict == 0:
                piece = ""  # the prompt only: the one token computed is not part of the answer
            piece = self._apply_rules(piece)
            self.text += piece
            yield piece
            if self.limited or out.finished:
                if self.limited:
                    self.group.abort()
                return

    def _apply_rules(self, piece: str) -> str:
        """llama.cpp's stop rules on the text as it grows (its process_token): n_indent cuts the
        first line indented less than asked before its first character; t_max_predict_ms ends
        the generation at a line break once that long has passed since the first token."""
        whole = self.text + piece
        cut = indent_cut(whole, self.checked, self.body.n_indent)
        if cut is not None:
            self.limited = True
            return whole[len(self.text) : cut]
        self.checked = indent_resume(whole)
        limit = self.body.t_max_predict_ms
        if limit > 0 and "\n" in piece and self.first_token is not None:
            if (time.monotonic() - self.first_token) * 1000 > limit:
                self.limited = True
        return piece

    async def events(self) -> AsyncIterator[bytes]:
        last = ""
        async for piece in self.steps():
            if self._ended():
                last = piece  # the last event carries the last piece, as before
                break
            if piece:
                yield encode_event({"index": 0, "content": piece, "stop": False})
        else:
            last = ""
        yield encode_event(self.final(last))

    def _ended(self) -> bool:
        return self.limited or (self.last is not None and self.last.finished)

    def final(self, content: str) -> dict[str, Any]:
        """llama.cpp's last (or only) answer, filtered by `response_fields`."""
        return pick_fields(_final(self, content), self.body.response_fields)


def _final(run: _Run, content: str) -> dict[str, Any]:
    """The content (a stream's last piece) and the counts."""
    out = run.last
    sample = out.outputs[0] if out is not None and out.outputs else None
    stop = sample.stop_reason if sample is not None else None
    if run.limited or run.body.n_predict == 0:
        stop_type, stop = "limit", None
    else:
        finish = sample.finish_reason if sample is not None else None
        kinds = {"stop": "word" if isinstance(stop, str) else "eos", "length": "limit"}
        stop_type = kinds.get(finish or "", "none")
    m = out.metrics if out is not None else None
    prompt_ms = predicted_ms = None
    if m is not None and m.first_token_time is not None:
        if m.first_scheduled_time is not None:
            prompt_ms = round((m.first_token_time - m.first_scheduled_time) * 1000, 3)
        if m.last_token_time is not None:
            predicted_ms = round((m.last_token_time - m.first_token_time) * 1000, 3)
    generated = 0 if run.body.n_predict == 0 else run.tokens
    prompt_n = prompt_len = cached = 0
    if out is not None:
        prompt_len, cached = len(out.prompt_token_ids), out.num_cached_tokens
        prompt_n = prompt_len - cached
    return {
        "index": 0,
        "content": content,
        "stop": True,
        "model": run.model,
        "stop_type": stop_type,
        "stopping_word": stop if isinstance(stop, str) else "",
        "tokens_predicted": generated,
        "tokens_evaluated": prompt_len,
        "tokens_cached": cached,
        "truncated": False,
        "timings": {
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": _per(prompt_ms, prompt_n),
            "prompt_per_second": _rate(prompt_n, prompt_ms),
            "predicted_n": generated,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": _per(predicted_ms, generated),
            "predicted_per_second": _rate(generated, predicted_ms),
        },
    }


def _per(ms: float | None, n: int) -> float | None:
    return round(ms / n, 3) if ms is not None and n > 0 else None


def _rate(n: int, ms: float | None) -> float | None:
    return round(n * 1000 / ms, 3) if ms and n > 0 else None
