"""llama.cpp's `POST /infill`: code completion between a prefix and a suffix, the route editor
plugins (llama.vim, llama.vscode) and some IDE clients call.

The body takes llama.cpp's fields `input_prefix`, `input_suffix`, `input_extra` (context files,
`[{"filename", "text", "time"}]`), `prompt` (text the middle starts with), `n_predict` (its name
for max_tokens; -1: up to the context; 0: the prompt only, to fill the prefix cache),
`cache_prompt` (true only: inferd's prefix cache always reuses what it can), `stream`, and what
the plugins send with every request: `samplers` (the chain, where inferd can reproduce it,
`infill` included: engine/sampling/infill_sampler.py), `n_indent`, `t_max_prompt_ms`,
`t_max_predict_ms`, `response_fields`, `id_slot` (-1 or 0) and `n_cmpl` (completions of the
prompt; `n` is its alias); plus the sampling and structured-output fields every generation route
takes (vLLM's names). Anything else is a 400 naming it. The prompt is built from the model's FIM
tokens (server/generation/infill_prompt.py); a model without them is a 400. As in llama.cpp,
the model's FIM pad, repo-name and file-separator tokens end the generation (unless
`ignore_eos`).

`n_cmpl` completions are one engine request with n samples: the prompt is computed once and
each sample forks from it (a seeded request's sample i uses seed + i, as llama.cpp's children).

The answer has llama.cpp's /completion shape (infill_answer.py): `index`, `content`, `stop`,
`stop_type` (`eos`, `word`, `limit`), `stopping_word`, the token counts and `timings`; with
n_cmpl > 1 a JSON array of them in index order. Streamed, one `data: {"index", "content",
"stop": false}` event per piece and, for each completion, a last one with `stop: true` and its
counts, without a `[DONE]` line (llama.cpp's own stream has none). Admission and `--api-key` are
those of every generation route.

The stop rules that llama.cpp applies to the text (`n_indent`, `t_max_predict_ms`) and the
prompt's time limit are applied here, as each step's text arrives: the completion's answer is
then what it has, `stop_type: "limit"` (llama.cpp's type for both), and the engine request is
aborted once every completion has ended.
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
from inferd.server.extra.infill_answer import Completion, answer
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
    n: int = 1  # n_cmpl's alias (llama.cpp reads it when n_cmpl is not given)
    samplers: list[str] | None = None  # None: inferd's own order (infill_rules.py)
    n_indent: int = Field(default=0, ge=0)
    t_max_prompt_ms: int = -1  # <= 0: no limit (llama.cpp's default -1)
    t_max_predict_ms: int = -1
    response_fields: list[str] = Field(default_factory=list)
    id_slot: int = -1
    n_cmpl: int = 1


def infill_params(body: InfillRequest, fim: Any) -> SamplingParams:
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
    # n_predict 0 asks for the prompt only (plugins send it to put context files into the
    # cache): the engine computes the prompt and one token, which the answer leaves out.
    params = sampling_params(body, {-1: None, 0: 1}.get(body.n_predict, body.n_predict))
    samples = body.n_predict != 0
    check_samplers(body.samplers, params, samples=samples)
    changes: dict[str, Any] = {"n": completions(body)}
    if samples and body.samplers is not None and "infill" in body.samplers:
        changes["infill_sampler"] = True
    if not params.ignore_eos:
        # llama.cpp counts the FIM pad, repo and file-separator tokens as end of generation.
        ends = [t for t in (fim.pad, fim.rep, fim.sep) if t is not None]
        ends = [t for t in ends if t not in params.stop_token_ids]
        changes["stop_token_ids"] = [*params.stop_token_ids, *ends]
    params = params.with_changes(**changes)
    # The route reads each step's news whether it streams or not: the stop rules look at the
    # text as it grows, and the answer is built from the pieces.
    params.output_kind = RequestOutputKind.DELTA
    return params


def completions(body: InfillRequest) -> int:
    """llama.cpp's `n_cmpl` (its alias `n` when n_cmpl is not given): completions of the one
    prompt, which the engine computes once (SamplingParams.n)."""
    count = body.n_cmpl if "n_cmpl" in body.model_fields_set else body.n
    if count < 1:
        name = "n_cmpl" if "n_cmpl" in body.model_fields_set else "n"
        raise InvalidRequest(name, f"{name} must be an integer >= 1, got {count}")
    return count


@router.post("/infill")
@abandon_when_gone
async def infill(body: InfillRequest, request: Request) -> Response:
    arrival = arrival_now()
    state = get_state(request)
    model = state.check_model(body.model)
    note_user(request, body)
    fim = model_fim(state.tokenizer, "input_prefix")
    params = infill_params(body, fim)
    files = [ContextFile(f.filename, checked_text(f"input_extra[{i}].text", f.text))
             for i, f in enumerate(body.input_extra)]  # fmt: skip
    texts = [body.input_prefix, body.input_suffix, body.prompt, *(f.text for f in files)]
    group = state.admit(request, ["".join(texts) or " "], params.n, param="input_prefix")

    def build() -> list[dict[str, Any]]:
        ids = infill_ids(state.tokenizer, fim, checked_text("input_prefix", body.input_prefix),
                         checked_text("input_suffix", body.input_suffix),
                         checked_text("prompt", body.prompt), files)  # fmt: skip
        return [{"prompt": None, "prompt_token_ids": ids}]

    prompts = salted(await group.tokenize(build), body.cache_salt)
    prompts = state.with_adapter(prompts, body.model)
    try:
        await group.submit(new_id("infill"), prompts, params, arrival)
    except InvalidRequest as e:
        if e.param == "n" and "n_cmpl" in body.model_fields_set:  # the engine's limit on n
            raise InvalidRequest("n_cmpl", e.message.replace("n must", "n_cmpl must", 1)) from e
        raise
    run = _Run(group, body, model, arrival, params.n)
    if body.stream:
        return sse_response(guarded(group, request, run.events(), _failed))
    try:
        async for _ in run.steps():
            pass
    finally:
        group.abort()
    answers = [run.final(c, c.text) for c in run.completions]
    return JSONResponse(answers[0] if len(answers) == 1 else answers)


def _failed(error: Any) -> list[bytes]:
    return [error_event(error.message, code=error.code)]


class _Run:
    """One /infill request's generation: each completion's text so far, read step by step, and
    the rules that end one early (llama.cpp's n_indent and t_max_predict_ms) or all of them
    (t_max_prompt_ms)."""

    def __init__(self, group: RequestGroup, body: InfillRequest, model: str, arrival: float,
                 n: int):  # fmt: skip
        self.group, self.body, self.model, self.arrival = group, body, model, arrival
        self.completions = [Completion(i) for i in range(n)]
        self.last: RequestOutput | None = None
        self.first_token: float | None = None  # this route's clock, when the first token came

    async def steps(self) -> AsyncIterator[tuple[Completion, str]]:
        """Each completion's new text (what its answer gains) as it comes, until every one has
        ended; a completion that ends yields once more (its last piece, maybe empty)."""
        outputs = self.group.outputs()
        deadline = None
        if self.body.t_max_prompt_ms > 0:
            deadline = self.arrival + self.body.t_max_prompt_ms / 1000
        while not all(c.ended for c in self.completions):
            try:
                if deadline is not None and self.first_token is None:
                    left = max(deadline - time.monotonic(), 0.0)
                    out = await asyncio.wait_for(anext(outputs), left)
                else:
                    out = await anext(outputs)
            except StopAsyncIteration:
                return
            except TimeoutError:
                # t_max_prompt_ms: no token came in time: the answers are empty and sent now,
                # while the prompt is computed to its end all the same (llama.vim's warm-up
                # sends 1 ms and wants its context files in the prefix cache). llama.cpp
                # declares the field without applying it; this is inferd's meaning.
                self.group.finish_prompts()
                for c in self.completions:
                    if not c.ended:
                        c.end(limited=True)
                        yield c, ""
                return
            self.last = out
            for sample in out.outputs:
                c = self.completions[sample.index]
                if c.ended:
                    continue  # a rule ended it here; the engine's later tokens are dropped
                if self.first_token is None and sample.token_ids:
                    self.first_token = time.monotonic()
                c.tokens += len(sample.token_ids)
                piece = "" if self.body.n_predict == 0 else sample.text  # prompt only
                piece = self._apply_rules(c, piece)
                if sample.finish_reason is not None:
                    c.finish, c.stop = sample.finish_reason, sample.stop_reason
                    c.end()
                c.text += piece
                yield c, piece
            if out.finished:
                for c in self.completions:
                    if not c.ended:
                        c.end()
                        yield c, ""

    def _apply_rules(self, c: Completion, piece: str) -> str:
        """llama.cpp's stop rules on a completion's text as it grows (its process_token):
        n_indent cuts the first line indented less than asked before its first character;
        t_max_predict_ms ends the generation at a line break once that long has passed since
        the first token."""
        whole = c.text + piece
        cut = indent_cut(whole, c.checked, self.body.n_indent)
        if cut is not None:
            c.end(limited=True)
            return whole[len(c.text) : cut]
        c.checked = indent_resume(whole)
        limit = self.body.t_max_predict_ms
        if limit > 0 and "\n" in piece and self.first_token is not None:
            if (time.monotonic() - self.first_token) * 1000 > limit:
                c.end(limited=True)
        return piece

    async def events(self) -> AsyncIterator[bytes]:
        """llama.cpp's stream: `{"index", "content", "stop": false}` per piece, then each
        completion's answer as its last event (`stop: true`), when it ends."""
        async for c, piece in self.steps():
            if c.ended:
                yield encode_event(self.final(c, piece))
            elif piece:
                yield encode_event({"index": c.index, "content": piece, "stop": False})

    def final(self, c: Completion, content: str) -> dict[str, Any]:
        """llama.cpp's last (or only) answer of completion `c`, filtered by `response_fields`."""
        whole = answer(c, content, self.last, self.model, self.body.n_predict == 0)
        return pick_fields(whole, self.body.response_fields)
