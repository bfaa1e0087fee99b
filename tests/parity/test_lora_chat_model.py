"""A LoRA adapter made by `peft` on the chat model (smollm2-135m-instruct, Llama architecture):
inferd's greedy tokens under the adapter equal HF transformers + peft on the same GGUF file
dequantised to float32 (the catalog's float32 mode), and the adapter changes them. Runs when the
model is in the cache, as tests/parity/test_chat_model.py."""

from __future__ import annotations

import pytest
import torch
from lora_adapters import make_adapter

from inferd.loader import catalog

pytestmark = pytest.mark.skipif(
    not catalog.is_present(catalog.SMOLLM2_INSTRUCT),
    reason="smollm2-135m-instruct is not in the cache (inferd pull smollm2-135m-instruct)",
)
TEXTS = ["The capital of France is", "def fibonacci(n):"]
NEW_TOKENS = 16


def test_smollm2_adapter_matches_hf_peft(tmp_path):
    from tiny_models import hf_greedy
    from transformers import AutoModelForCausalLM

    from inferd import LLM, LoRARequest, SamplingParams

    path = catalog.SMOLLM2_INSTRUCT.path
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                              dtype=torch.float32).eval()  # fmt: skip
    peft_model = make_adapter(hf, tmp_path / "adapter", seed=7, r=16, alpha=32, gain=0.5)
    llm = LLM(model="smollm2-135m-instruct", kv_cache_memory=64 << 20, enable_lora=True,
              max_lora_rank=16, attention_backend="torch")  # fmt: skip
    prompts = [llm.engine.tokenizer.encode(t) for t in TEXTS]
    expected = [hf_greedy(peft_model, p, NEW_TOKENS)[1] for p in prompts]
    base = [hf_greedy(hf, p, NEW_TOKENS)[1] for p in prompts]
    assert expected != base, "the adapter changes the greedy tokens"
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    lora = LoRARequest("smol-adapter", 1, str(tmp_path / "adapter"))
    both = llm.generate(prompts * 2, params, use_tqdm=False, lora_request=[lora, lora, None, None])
    assert [o.outputs[0].token_ids for o in both] == expected + base
