"""The Ollama API's routes on a scripted engine (no model): the official `ollama` client and
LangChain's `ChatOllama` drive the app in-process (their httpx transport is the test client's),
so what each Ollama field did to the prompt and SamplingParams reaching the engine is seen
exactly, tool calls come back as objects, and every refusal is a 400 naming the field, in
Ollama's `{"error": "..."}` shape."""

from __future__ import annotations

import json
from contextlib import contextmanager

import httpx
import ollama
import pytest
from fake_client import ScriptedClient
from langchain_core.tools import tool
from langchain_ollama import ChatOllama
from starlette.testclient import TestClient

from inferd.server.app import ServerSettings, create_app
from inferd.server.ollama.pull import PullTarget
from inferd.server.openai.tool_calls import ToolSettings

KEY = "k-ollama"
AUTH = {"Authorization": f"Bearer {KEY}"}
CALL = '[get_weather(city="Paris")]'  # the pythonic format's call
CITY = {"city": "Paris"}
HI = [{"role": "user", "content": "hi"}]


def get_weather(city: str) -> str:
    """Current weather of a city.

    Args:
      city: the city
    """
    return "sunny"


class Catalog:
    """Two catalog models: one already here, one that a pull fetches (counted)."""

    def __init__(self):
        self.fetched = 0

    def names(self):
        return ["here-model", "far-model"]

    def target(self, name):
        def fetch():
            self.fetched += 1

        if name not in self.names():
            return None
        fetch_it = fetch if name == "far-model" else None
        return PullTarget(name, f"{name}-pkg==1.0", "ab" * 32, fetch_it)


class InProcess(httpx.BaseTransport):
    """The clients' httpx transport: each request goes to the app through the test client (a
    stream arrives whole, which the clients read line by line all the same)."""

    def __init__(self, http: TestClient):
        self.http = http

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        r = self.http.request(request.method, request.url.path, headers=dict(request.headers),
                              content=request.read())  # fmt: skip
        return httpx.Response(r.status_code, headers=dict(r.headers), content=r.content)


@contextmanager
def served(reply: str = "hello", catalog=None, harmony: bool = False):
    fake = ScriptedClient(lambda ids, params, k: reply)
    tools = ToolSettings("pythonic", True, "pythonic")
    if harmony:  # a reasoning model (gpt-oss), whose template reads reasoning_effort
        tools = ToolSettings("harmony", True, "harmony", harmony=True)
        fake.tokenizer.chat_template = "{{ reasoning_effort }}"
    settings = ServerSettings(api_key=KEY, tools=tools, catalog=catalog)
    with TestClient(create_app(fake, settings)) as http:
        sdk = ollama.Client(host="http://testserver", headers=AUTH, transport=InProcess(http))
        yield sdk, fake, http


def test_chat_and_generate_whole_and_streamed():
    with served() as (sdk, fake, _):
        r = sdk.chat(model="fake-model:latest", messages=HI, stream=False)
        assert r.message.content == "hello" and r.done and r.done_reason == "stop"
        assert r.model == "fake-model:latest" and r.eval_count == 5
        assert r.prompt_eval_count == len(fake.last[1]["prompt_token_ids"])
        assert all(isinstance(getattr(r, f), int) for f in ("total_duration", "eval_duration"))
        parts = list(sdk.chat(model="fake-model", messages=HI, stream=True))
        assert "".join(p.message.content for p in parts) == "hello"
        assert [p.done for p in parts][-2:] == [False, True] and parts[-1].eval_count == 5
        g = sdk.generate(model="fake-model", prompt="hi", system="be kind")
        assert g.response == "hello" and fake.last[1]["prompt"] == "system:be kind|user:hi|gen|"
        sdk.generate(model="fake-model", prompt="as is", raw=True)
        assert fake.last[1]["prompt"] == "as is"  # no template
        assert sdk.generate(model="fake-model", prompt="").done_reason == "load"
        with pytest.raises(ollama.ResponseError) as e:  # a load's options are checked too
            sdk.chat(model="fake-model", messages=[], options={"num_gpu": 1})
        assert "options.num_gpu" in e.value.error


def test_options_reach_the_engine_under_their_sampling_names():
    with served() as (sdk, fake, _):
        options = {"temperature": 0.5, "top_k": 7, "top_p": 0.9, "min_p": 0.1, "seed": 3,
                   "repeat_penalty": 1.2, "repeat_last_n": -1, "presence_penalty": 0.5,
                   "frequency_penalty": 0.25, "stop": ["\n"], "num_predict": 3,
                   "typical_p": 1.0, "mirostat": 0}  # fmt: skip
        sdk.chat(model="fake-model", messages=HI, options=options)
        p = fake.last[2]
        assert (p.temperature, p.top_k, p.top_p, p.min_p, p.seed) == (0.5, 7, 0.9, 0.1, 3)
        assert (p.repetition_penalty, p.presence_penalty, p.frequency_penalty) == (1.2, 0.5, 0.25)
        assert p.stop == ["\n"] and p.max_tokens == 3
        # num_ctx bounds prompt + reply: the reply gets what the prompt leaves.
        sdk.chat(model="fake-model", messages=HI, options={"num_ctx": 20})
        assert fake.last[2].max_tokens == 20 - len(fake.last[1]["prompt_token_ids"])


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"options": {"num_gpu": 1}}, "options.num_gpu"),
        ({"options": {"typical_p": 0.5}}, "options.typical_p"),
        ({"options": {"repeat_last_n": 64}}, "options.repeat_last_n"),
        ({"options": {"foo": 1}}, "options.foo"),
        ({"options": {"temperature": -1}}, "options.temperature"),
        ({"options": {"num_ctx": 5}}, "options.num_ctx=5"),
        ({"keep_alive": 0}, "keep_alive"),
        ({"think": True}, "think"),
        ({"logprobs": True}, "logprobs"),
        ({"format": "yaml"}, "format"),
        ({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "images"),
        ({"template": "{{ .Prompt }}"}, "template"),
        ({"context": [1, 2]}, "context"),
        ({"suffix": "end"}, "suffix"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_it(fields, named):
    route = "/api/generate" if {"template", "context", "suffix"} & set(fields) else "/api/chat"
    asked = {"messages": HI} if route == "/api/chat" else {"prompt": "hi"}
    body = {"model": "fake-model", "stream": False, **asked, **fields}
    with served() as (_, _, http):
        r = http.post(route, json=body, headers=AUTH)
    assert r.status_code == 400 and isinstance(r.json()["error"], str), r.text
    assert named in r.json()["error"]


def test_errors_have_ollamas_shape_and_the_key_is_required():
    with served() as (sdk, _, http):
        r = http.get("/api/tags")  # no key
        assert r.status_code == 401 and isinstance(r.json()["error"], str)
        with pytest.raises(ollama.ResponseError) as e:
            sdk.chat(model="other", messages=HI)
        assert e.value.status_code == 404 and "fake-model" in e.value.error
        # The prompt's length and the window's, where Ollama would cut the prompt.
        with pytest.raises(ollama.ResponseError) as e:
            sdk.generate(model="fake-model", prompt="a long prompt", options={"num_ctx": 6})
        assert "the prompt is 23 tokens" in e.value.error and "num_ctx=6" in e.value.error
        assert "error" in http.post("/api/create", json={}, headers=AUTH).json()


def test_tool_calls_come_back_as_objects_and_results_go_in_by_tool_name():
    with served(CALL) as (sdk, fake, http):
        r = sdk.chat(model="fake-model", messages=HI, tools=[get_weather])
        [call] = r.message.tool_calls
        assert call.function.name == "get_weather" and call.function.arguments == CITY
        lines = [p for p in sdk.chat(model="fake-model", messages=HI, tools=[get_weather],
                                     stream=True) if p.message.tool_calls]  # fmt: skip
        assert [c.function.arguments for c in lines[0].message.tool_calls] == [CITY]
        history = HI + [r.message, {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
        sdk.chat(model="fake-model", messages=history, tools=[get_weather])
        [_, asked, answer] = [m for m in fake.tokenizer.last_call["messages"]]
        assert answer["tool_call_id"] == asked["tool_calls"][0]["id"]
        # LangChain's ChatOllama reads the same calls.
        llm = ChatOllama(model="fake-model", base_url="http://testserver",
                         client_kwargs={"headers": AUTH, "transport": InProcess(http)})  # fmt: skip
        msg = llm.bind_tools([tool(get_weather)]).invoke("weather in Paris?")
        assert [(c["name"], c["args"]) for c in msg.tool_calls] == [("get_weather", CITY)]


def test_a_json_schema_format_is_a_strict_structured_output():
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    with served('{"city": "Paris"}') as (sdk, fake, _):
        r = sdk.chat(model="fake-model", messages=HI, format=schema)
        assert json.loads(r.message.content) == {"city": "Paris"}
        spec = fake.last[2].structured_outputs
        assert spec.json == schema and spec.closes_objects
        sdk.generate(model="fake-model", prompt="hi", format="json")
        assert fake.last[2].structured_outputs.json_object


def test_model_routes_and_pulls_from_the_catalog():
    catalog = Catalog()
    with served(catalog=catalog) as (sdk, _, _):
        assert [m.model for m in sdk.list().models] == ["fake-model:latest"]
        assert [m.context_length for m in sdk.ps().models] == [256]
        assert "tools" in sdk.show("fake-model").capabilities
        assert sdk.pull("here-model").status == "success" and catalog.fetched == 0
        statuses = [p.status for p in sdk.pull("far-model:latest", stream=True)]
        assert statuses[-1] == "success" and catalog.fetched == 1
        with pytest.raises(ollama.ResponseError) as e:
            sdk.pull("nowhere")
        assert e.value.status_code == 404 and "far-model" in e.value.error


def test_think_returns_a_reasoning_models_thinking_and_levels_reach_its_template():
    harmony = ("<|channel|>analysis<|message|>Think first.<|end|><|start|>assistant"
               "<|channel|>final<|message|>Blue.")  # fmt: skip
    with served(harmony, harmony=True) as (sdk, fake, _):
        many = {"num_predict": 400}  # the scripted engine's tokens are characters
        r = sdk.chat(model="fake-model", messages=HI, think="low", options=many)
        assert (r.message.thinking, r.message.content) == ("Think first.", "Blue.")
        assert fake.tokenizer.last_call["chat_template_kwargs"] == {"reasoning_effort": "low"}
        parts = list(sdk.generate(model="fake-model", prompt="hi", stream=True, options=many))
        assert "".join(p.thinking or "" for p in parts) == "Think first."
        assert "".join(p.response for p in parts) == "Blue."
        with pytest.raises(ollama.ResponseError) as e:
            sdk.chat(model="fake-model", messages=HI, think=False)  # it cannot stop reasoning
        assert e.value.status_code == 400 and "think" in e.value.error
