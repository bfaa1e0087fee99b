"""The chat model users get with `inferd pull smollm2-135m-instruct` answers a plain question,
greedy, through the offline API and through `inferd chat` (which picks it without --model);
tests/server/test_chat_model_served.py asks `inferd serve smollm2-135m-instruct`.

It runs when the model is in the cache: the suite never downloads, and the README's test command
(what CI runs) pulls it first. HF transformers' float32
greedy answer on the same file is "The capital of France is Paris."."""

from __future__ import annotations

import subprocess
import sys

import pytest

from inferd.loader import catalog

QUESTION = "What is the capital of France?"

pytestmark = pytest.mark.skipif(
    not catalog.is_present(catalog.SMOLLM2_INSTRUCT),
    reason="smollm2-135m-instruct is not in the cache (inferd pull smollm2-135m-instruct)",
)


def test_llm_chat_answers_paris():
    from inferd import LLM, SamplingParams

    llm = LLM(model="smollm2-135m-instruct", kv_cache_memory=64 << 20)
    out = llm.chat([{"role": "user", "content": QUESTION}],
                   SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)  # fmt: skip
    assert out[0].outputs[0].text == "The capital of France is Paris."
    assert out[0].outputs[0].finish_reason == "stop"


def test_inferd_chat_uses_the_pulled_chat_model():
    result = subprocess.run(
        [sys.executable, "-m", "inferd", "chat", "--max-tokens", "24", "--kv-cache-memory",
         "64MiB", "--quiet"],
        input=f"{QUESTION}\n/reset\n/exit\nnot read\n",
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == "The capital of France is Paris.\n"
    assert "base model" not in result.stderr
