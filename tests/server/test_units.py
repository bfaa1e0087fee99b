"""The server's pure pieces, without a model or a server: request → SamplingParams mapping, SSE
framing, error mapping, logprob formats, stream deltas, metrics, the API-key check."""

from __future__ import annotations

import json
import math

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from inferd.engine.frontend.input_processor import InputLimits, InputProcessor
from inferd.engine_client import EngineStats, ModelInfo
from inferd.errors import ContextTooLong, EngineDeadError, InvalidRequest, Overloaded, RequestFailed
from inferd.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from inferd.sampling_params import SamplingParams
from inferd.server.generation.request_params import chat_params, completion_params
from inferd.server.http.auth import bearer_token, key_matches
from inferd.server.http.errors import error_status, from_validation_error
from inferd.server.http.sse import DONE, encode_event, error_event
from inferd.server.metrics.prometheus import ServerMetrics
from inferd.server.openai.choices import ChoiceDeltas, Echo
from inferd.server.openai.protocol import ChatCompletionRequest, CompletionRequest
from inferd.server.openai.shapes import (
    LOGPROB_FLOOR,
    TokenText,
    chat_logprobs,
    completion_logprobs,
    usage_of,
)


# ---- protocol -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "prompt, expected",
    [("hi", ["hi"]), (["a", "b"], ["a", "b"]), ([1, 2], [[1, 2]]), ([[1], [2, 3]], [[1], [2, 3]])],
)
def test_completion_prompt_shapes(prompt, expected):
    assert CompletionRequest(prompt=prompt).prompts() == expected


def test_completion_sampling_mapping_keeps_openai_defaults_and_vllm_extras():
    p = completion_params(CompletionRequest(prompt="x"))
    assert p.max_tokens == 16 and p.temperature == 1.0 and p.logprobs is None
    body = dict(prompt="x", max_tokens=5, temperature=0, top_k=3, min_p=0.1, n=2, seed=7,
                repetition_penalty=1.2, min_tokens=2, ignore_eos=True, stop=["\n"],
                stop_token_ids=[9], logit_bias={"5": -100}, logprobs=2, echo=True,
                include_stop_str_in_output=True, skip_special_tokens=False)  # fmt: skip
    p = completion_params(CompletionRequest(**body))
    assert (p.max_tokens, p.temperature, p.top_k, p.min_p, p.n, p.seed) == (5, 0, 3, 0.1, 2, 7)
    assert p.repetition_penalty == 1.2 and p.min_tokens == 2 and p.ignore_eos
    assert p.stop == ["\n"] and p.stop_token_ids == [9] and p.logit_bias == {5: -100.0}
    assert p.logprobs == 2 and p.prompt_logprobs == 2  # echo asks for the prompt's too
    assert p.include_stop_str_in_output and not p.skip_special_tokens


def test_chat_sampling_mapping():
    msgs = [{"role": "user", "content": "hi"}]
    p = chat_params(ChatCompletionRequest(messages=msgs))
    assert p.max_tokens is None and p.logprobs is None  # None: what the context leaves
    p = chat_params(ChatCompletionRequest(messages=msgs, max_tokens=9, max_completion_tokens=4,
                                          logprobs=True, top_logprobs=3))  # fmt: skip
    assert p.max_tokens == 4 and p.logprobs == 3
    with pytest.raises(ValueError, match="top_logprobs"):
        chat_params(ChatCompletionRequest(messages=msgs, top_logprobs=2))
    parts = ChatCompletionRequest(messages=[{"role": "user", "content": [
        {"type": "text", "text": "a"}]}]).template_messages()  # fmt: skip
    assert parts == [{"role": "user", "content": [{"type": "text", "text": "a"}]}]
    with pytest.raises(ValueError, match="image_url"):
        ChatCompletionRequest(messages=[{"role": "user", "content": [
            {"type": "image_url"}]}]).template_messages()  # fmt: skip


STRICT = [("temperature", True), ("temperature", "0.5"), ("n", 1.5), ("max_tokens", "3"),
          ("stop", 5)]  # fmt: skip


@pytest.mark.parametrize("field, value", STRICT)
def test_types_are_strict(field, value):
    with pytest.raises(ValidationError):
        CompletionRequest(prompt="x", **{field: value})


def test_range_errors_name_the_parameter():
    with pytest.raises(ValueError, match="top_p"):
        completion_params(CompletionRequest(prompt="x", top_p=2.0))


# ---- errors ---------------------------------------------------------------------------------
def _raised(make) -> Exception:
    try:
        make()
    except Exception as e:  # noqa: BLE001 - the error itself is what the test looks at
        return e
    raise AssertionError("expected an error")


# The engine's own checks, as it runs them (prompts of token ids need no tokenizer).
_ENGINE = InputProcessor(None, InputLimits(vocab_size=262144, max_model_len=7264))


def _engine_request(prompt, **params):
    return _ENGINE.make_request("r", prompt, SamplingParams(**params))


@pytest.mark.parametrize(
    "make, message, param",
    [
        (lambda: SamplingParams(top_p=2.0), "top_p must be a number in (0, 1], got 2.0", "top_p"),
        (lambda: SamplingParams(logit_bias={5: 300}),
         "logit_bias[5] must be a finite number in [-100, 100], got 300", "logit_bias"),
        (lambda: _engine_request([]),
         "the prompt is empty: it must contain at least one token", "prompt"),
        (lambda: _engine_request([300000]),
         "prompt token id 300000 is outside the vocabulary [0, 262144)", "prompt"),
        (lambda: _engine_request([1] * 5, max_tokens=9000),
         "prompt (5 tokens) + max_tokens (9000) = 9005 exceeds max_model_len (7264)", "max_tokens"),
    ],
)  # fmt: skip
def test_typed_errors_name_their_parameter(make, message, param):
    error = _raised(make)
    assert isinstance(error, InvalidRequest) and str(error) == message
    api = error_status(error)
    assert (api.status, api.param, api.message) == (400, param, message)


def test_error_mapping_for_chat_context_length_and_engine_states():
    e = error_status(InvalidRequest("prompt", "the prompt is empty"), chat=True)
    assert (e.status, e.param) == (400, "messages")
    too_long = _raised(lambda: _engine_request([1] * 7264))
    assert isinstance(too_long, ContextTooLong)
    e = error_status(too_long)
    assert (e.status, e.param, e.code) == (400, "prompt", "context_length_exceeded")
    body = e.body()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    busy = error_status(Overloaded("the server's queue is full (1 requests waiting)"))
    assert (busy.status, busy.code, busy.headers) == (503, "queue_full", {"Retry-After": "1"})
    assert error_status(EngineDeadError("worker exited")).status == 503
    assert error_status(RequestFailed("RuntimeError: boom")).code == "engine_error"
    # Anything untyped is a bug, not the client's fault: no 400 for a stray ValueError.
    assert error_status(ValueError("something unrelated")) is None


def _validation_error(model, data) -> RequestValidationError:
    try:
        model.model_validate(data)
    except ValidationError as e:
        return RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()])
    raise AssertionError("expected a validation error")


def test_schema_errors_become_400_naming_the_field_without_internals():
    e = from_validation_error(_validation_error(CompletionRequest, {"prompt": 5}))
    assert e.status == 400 and e.param == "prompt" and e.message.startswith("prompt must be")
    e = from_validation_error(_validation_error(ChatCompletionRequest, {"messages": [{}]}))
    assert e.param == "messages.0.role" and "required" in e.message
    e = from_validation_error(_validation_error(CompletionRequest, {"prompt": "x", "n": "two"}))
    assert e.param == "n" and "str" not in e.param
    for err in (e,):
        assert "/" not in err.message and "pydantic" not in err.message


# ---- SSE ----------------------------------------------------------------------------------------
def test_sse_framing():
    event = encode_event({"a": "é", "b": [1, 2]})
    assert event == 'data: {"a":"é","b":[1,2]}\n\n'.encode()
    assert DONE == b"data: [DONE]\n\n"
    payload = json.loads(error_event("boom", code="engine_error")[6:])
    assert payload == {"error": {"message": "boom", "type": "server_error", "param": None,
                                 "code": "engine_error"}}  # fmt: skip

    # Never JSON that strict parsers reject: no Infinity or NaN tokens (logprobs are floored
    # before they get here; anything else non-finite becomes null).
    def strict(constant):
        raise ValueError(constant)

    for value in (math.inf, -math.inf, math.nan):
        event = encode_event({"x": value})
        assert json.loads(event[6:], parse_constant=strict) == {"x": None}


# ---- logprobs, usage, deltas --------------------------------------------------------------------
class CharTokenizer:
    """Token i is the letter chr(97 + i); 9 is a special token; 10 is the byte token <0xC3>."""

    all_special_ids = (9,)

    def decode(self, ids, skip_special_tokens=True):
        return "".join("<s>" if i == 9 else "\ufffd" if i == 10 else chr(97 + i) for i in ids)

    def convert_ids_to_tokens(self, ids):
        return ["<0xC3>" if i == 10 else chr(97 + i) for i in ids]


def test_completion_logprobs_format():
    texts = TokenText(CharTokenizer())
    entries = [None, {1: Logprob(-0.5, 1), 2: Logprob(-1.5, 2)},
               {3: Logprob(-float("inf"), 9), 0: Logprob(-0.1, 1)}]  # fmt: skip
    lp, end = completion_logprobs([0, 1, 3], entries, texts, text_offset=4)
    assert lp["tokens"] == ["a", "b", "d"] and lp["text_offset"] == [4, 5, 6] and end == 7
    assert lp["token_logprobs"] == [None, -0.5, LOGPROB_FLOOR]
    assert lp["top_logprobs"] == [None, {"b": -0.5, "c": -1.5}, {"d": LOGPROB_FLOOR, "a": -0.1}]


def test_chat_logprobs_lists_the_top_alternatives_in_rank_order():
    texts = TokenText(CharTokenizer())
    entry = {5: Logprob(-3.0, 4), 1: Logprob(-0.2, 1), 10: Logprob(-1.0, 2), 2: Logprob(-2, 3)}
    [item] = chat_logprobs([5], [entry], texts, top=2)
    assert item["token"] == "f" and item["logprob"] == -3.0 and item["bytes"] == [ord("f")]
    assert [a["token"] for a in item["top_logprobs"]] == ["b", "\ufffd"]
    assert item["top_logprobs"][1]["bytes"] == [0xC3]  # the byte itself, not U+FFFD's bytes


def test_usage_counts_each_prompt_once_whatever_n():
    outs = [
        RequestOutput("a", None, [1, 2, 3], [CompletionOutput(0, "", [4, 5]),
                                             CompletionOutput(1, "", [6])], True),
        RequestOutput("b", None, [1], [CompletionOutput(0, "", [7])], True),
    ]  # fmt: skip
    assert usage_of(outs) == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8,
                              "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip


def test_choice_deltas_send_only_what_is_new_and_finish_once():
    t = ChoiceDeltas(tokens_too=False)
    d = t.take(0, CompletionOutput(0, "Hel", [1, 2]))
    assert (d.text, d.token_ids, d.finish_reason, d.first) == ("Hel", [1, 2], None, True)
    assert t.take(0, CompletionOutput(0, "", [3])) is None  # a token held back, no text
    d = t.take(0, CompletionOutput(0, "lo", [4], finish_reason="stop"))
    assert (d.text, d.token_ids, d.finish_reason, d.first) == ("lo", [3, 4], "stop", False)
    assert t.take(0, CompletionOutput(0, "", [], finish_reason="stop")) is None  # finished once
    assert t.take(1, CompletionOutput(1, "x", [9])).text == "x"  # choices are independent
    owed = ChoiceDeltas(tokens_too=True)  # ...a token alone is owed when logprobs want it
    owed.take(0, CompletionOutput(0, "Hel", [1, 2]))
    d = owed.take(0, CompletionOutput(0, "", [3]))
    assert (d.text, d.token_ids) == ("", [3])


def test_choice_deltas_send_the_echo_first_and_the_prompt_tokens_with_it():
    t = ChoiceDeltas(tokens_too=True)
    echo = Echo("Say: ", [5, 6], [None, None])
    d = t.take(0, CompletionOutput(0, "hi", [7]), echo)
    assert (d.text, d.token_ids, d.echo) == ("Say: hi", [7], echo)
    d = t.take(0, CompletionOutput(0, "!", [8]))
    assert (d.text, d.echo) == ("!", None)


# ---- metrics ------------------------------------------------------------------------------------
def _out(rid, n_tokens, t, finished=False, reason=None):
    m = RequestMetrics(arrival_time=0.0, first_scheduled_time=0.5, first_token_time=1.0,
                       last_token_time=t, num_generation_tokens=n_tokens)  # fmt: skip
    if finished:
        m.finished_time = t
    return RequestOutput(rid, None, [1], [CompletionOutput(0, "", [0] * n_tokens,
                                                           finish_reason=reason)], finished,
                         metrics=m)  # fmt: skip


def _sample(text: str, name: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(name))
    return float(line.rsplit(" ", 1)[1])


def test_metrics_observe_itl_per_token_and_the_request_histograms():
    a, b = ServerMetrics("m"), ServerMetrics("m")  # separate registries: no clash
    a.observe_output(_out("r", 1, 1.0))
    a.observe_output(_out("r", 2, 1.2))
    a.observe_output(_out("r", 4, 1.6, finished=True, reason="length"))
    text = a.render().decode()
    assert _sample(text, "inferd:inter_token_latency_seconds_count") == 3  # 1 + 2 tokens
    assert math.isclose(_sample(text, "inferd:inter_token_latency_seconds_sum"), 0.6)
    assert _sample(text, "inferd:time_to_first_token_seconds_sum") == 1.0
    assert _sample(text, "inferd:e2e_request_latency_seconds_sum") == 1.6
    assert _sample(text, "inferd:request_queue_time_seconds_sum") == 0.5
    assert _sample(text, "inferd:request_prefill_time_seconds_sum") == 0.5
    assert math.isclose(_sample(text, "inferd:request_decode_time_seconds_sum"), 0.6)
    assert 'inferd:request_success_total{finished_reason="length",model_name="m"} 1.0' in text
    assert "inter_token_latency_seconds_count" in b.render().decode()


def test_metrics_counters_advance_by_stats_deltas():
    from inferd.engine.frontend.llm_engine import EngineStats

    m = ServerMetrics("m")
    m.update_stats(EngineStats(2, 1, 0.25, 0, 10, 4, 100, 7, 3))
    text = m.render(EngineStats(1, 0, 0.5, 1, 12, 6, 120, 9, 4)).decode()
    assert _sample(text, "inferd:prompt_tokens_total") == 120
    assert _sample(text, "inferd:generation_tokens_total") == 9
    assert _sample(text, "inferd:prefix_cache_hits_total") == 6
    assert _sample(text, "inferd:num_requests_running") == 1
    assert _sample(text, "inferd:kv_cache_usage_perc") == 0.5
    assert _sample(text, "inferd:spec_decode_num_drafts_total") == 0  # no speculation


def test_speculative_decoding_counters_with_vllm_names_and_positions():
    from inferd.engine.frontend.llm_engine import EngineStats

    m = ServerMetrics("m")

    def stats(generated, steps, drafts, draft_tokens, accepted, per_pos):
        # NOTE: the spec_decode_* fields by name: they come after `step_timing`.
        return EngineStats(1, 0, 0.1, 0, 0, 0, 10, generated, steps,
                           spec_decode_num_drafts=drafts,
                           spec_decode_num_draft_tokens=draft_tokens,
                           spec_decode_num_accepted_tokens=accepted,
                           spec_decode_num_accepted_tokens_per_pos=per_pos)  # fmt: skip

    m.update_stats(stats(5, 3, 2, 8, 5, (2, 2, 1, 0)))
    text = m.render(stats(9, 4, 3, 12, 8, (3, 3, 1, 1))).decode()
    assert _sample(text, "inferd:spec_decode_num_drafts_total") == 3
    assert _sample(text, "inferd:spec_decode_num_draft_tokens_total") == 12
    assert _sample(text, "inferd:spec_decode_num_accepted_tokens_total") == 8
    per_pos = "inferd:spec_decode_num_accepted_tokens_per_pos_total"
    assert f'{per_pos}{{engine="0",model_name="m",position="0"}} 3.0' in text
    assert f'{per_pos}{{engine="0",model_name="m",position="3"}} 1.0' in text


# ---- auth ---------------------------------------------------------------------------------------
def test_bearer_token_and_constant_time_match():
    assert bearer_token([(b"authorization", b"Bearer abc")]) == b"abc"
    assert bearer_token([(b"Authorization", b"Basic abc")]) is None
    assert bearer_token([]) is None
    assert key_matches(b"abc", b"abc") and not key_matches(b"abd", b"abc")
    assert not key_matches(None, b"abc") and not key_matches(b"", b"abc")


# ---- the app on a fake engine client -------------------------------------------------------------
class _BrokenTokenizer:
    def encode(self, text, add_special_tokens=True):
        raise ValueError("a bug deep inside")  # untyped: not the client's fault

    def decode(self, ids, skip_special_tokens=True):
        return ""

    def convert_ids_to_tokens(self, ids):
        return [None for _ in ids]

    def apply_chat_template(self, messages, add_generation_prompt=True, **kwargs):
        raise ValueError("this model has no chat template; pass one with --chat-template")

    def chat_prompt(self, messages, add_generation_prompt=True, **kwargs):
        raise ValueError("this model has no chat template; pass one with --chat-template")


class _FakeClient:
    """The smallest EngineClient: the server must need nothing more."""

    model_info = ModelInfo("fake", "Fake", 64, 100, "fp_fake")
    tokenizer = _BrokenTokenizer()

    def start(self):
        pass

    def stop(self, timeout=30.0):
        pass

    async def add_request(self, request_id, prompt, params, outputs, arrival_time=None):
        raise Overloaded("the server's queue is full (0 requests waiting)")

    def abort(self, request_id):
        pass

    def health(self):
        return None

    def stats(self):
        return EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0, 0)

    def observe_outputs(self, callback):
        pass


def test_the_app_needs_only_an_engine_client_and_maps_errors_by_type(caplog):
    from starlette.testclient import TestClient

    from inferd.engine_client import EngineClient
    from inferd.server.app import create_app

    assert isinstance(_FakeClient(), EngineClient)
    with TestClient(create_app(_FakeClient())) as http:
        assert http.get("/v1/models").json()["data"][0]["id"] == "fake"
        busy = http.post("/v1/completions", json={"prompt": [1, 2]})
        assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
        chat = http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
        )
        assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
        surrogate = b'{"prompt": "a\\ud800b"}'  # valid JSON, but no text a tokenizer takes
        bad = http.post(
            "/v1/completions", content=surrogate, headers={"Content-Type": "application/json"}
        )
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
        with caplog.at_level("ERROR"):
            bug = http.post("/v1/completions", json={"prompt": "hi"})
    assert bug.status_code == 500
    message = bug.json()["error"]["message"]
    assert message.startswith("internal server error (id err-") and "bug" not in message
    logged = [r for r in caplog.records if r.exc_info]
    assert len(logged) == 1 and message[len("internal server error (id ") : -1] in logged[0].message
