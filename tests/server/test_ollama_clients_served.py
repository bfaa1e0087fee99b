"""The Ollama API end to end: the official `ollama` client against `inferd serve` with the
embedded model (greedy replies equal to /v1/chat/completions', whole and streamed; a JSON
schema format; embeddings), and LangChain's `ChatOllama` against the pulled chat model
(`smollm2-135m-instruct`, skipped where absent): invoke, stream, bind_tools,
with_structured_output. A few tokens each."""

from __future__ import annotations

import json
import math

import ollama
import pytest
from langchain_core.tools import tool
from langchain_ollama import ChatOllama
from pydantic import BaseModel
from server_helpers import API_KEY

pytestmark = pytest.mark.slow

AUTH = {"Authorization": f"Bearer {API_KEY}"}
GREEDY = {"temperature": 0, "num_predict": 6}
ASK = [{"role": "user", "content": "Name a color."}]


class City(BaseModel):
    city: str


def get_weather(city: str) -> str:
    """Current weather of a city."""
    return "sunny"


def test_the_ollama_client_gets_the_chat_routes_greedy_reply(server, http, model_name):
    sdk = ollama.Client(host=server.url, headers=AUTH, timeout=120)
    body = {"messages": ASK, "max_tokens": 6, "temperature": 0}
    expected = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    r = sdk.chat(model=f"{model_name}:latest", messages=ASK, options=GREEDY)
    assert r.message.content == expected["content"] and r.eval_count <= 6
    assert r.prompt_eval_count > 0 and r.total_duration >= r.eval_duration > 0
    streamed = sdk.chat(model=model_name, messages=ASK, options=GREEDY, stream=True)
    assert "".join(p.message.content for p in streamed) == expected["content"]
    schema = City.model_json_schema()
    place = sdk.generate(model=model_name, prompt="Name a city in France.", format=schema,
                         options={"temperature": 0, "num_predict": 30})  # fmt: skip
    assert set(json.loads(place.response)) == {"city"}
    [a, b] = sdk.embed(model=model_name, input=["red", "blue"]).embeddings
    assert math.isclose(sum(x * x for x in a), 1.0, rel_tol=1e-3) and a != b


def test_chat_ollama_invokes_streams_calls_tools_and_structures(chat_server):
    def llm(tokens: int) -> ChatOllama:
        return ChatOllama(model="smollm2-135m-instruct", base_url=chat_server.url,
                          client_kwargs={"headers": AUTH, "timeout": 120}, temperature=0,
                          num_predict=tokens)  # fmt: skip

    answer = llm(12).invoke("What is the capital of France?")
    assert "Paris" in answer.content
    assert "".join(c.content for c in llm(12).stream("What is the capital of France?")) == (
        answer.content
    )
    # The model is too small to call tools reliably: the request with tools is answered.
    reply = llm(8).bind_tools([tool(get_weather)]).invoke("Weather in Paris?")
    assert reply.content or reply.tool_calls
    assert isinstance(llm(30).with_structured_output(City).invoke("A city in France?"), City)
