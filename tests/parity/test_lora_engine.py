"""LoRA adapters through the whole engine in the default mode (GGUF blocks, the C decoder layer
with the low-rank products beside the block kernels): on a tiny random Qwen3 GGUF file,

* a batch mixing three adapters and the base model gives each request exactly the tokens it
  gets alone (batch invariance across adapters), and each adapter changes the output;
* with one slot for three adapters, requests wait for the slot (LRU eviction) and still get
  their own tokens;
* the prefix cache never shares a block across adapters;
* the C layer and the PyTorch layers (the same blocks) agree on an adapter's logits.
"""

from __future__ import annotations

import pytest
from lora_adapters import write_random_adapter
from test_engine_invariance import _llm, _prompts, _repeating
from tiny_gguf import VOCAB, write_tiny_gguf

from inferd import LoRARequest, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _ids(outs):
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, c_kernels):
    """(GGUF path, three LoRARequests, prompts, an engine with three slots)."""
    root = tmp_path_factory.mktemp("lora")
    path = root / "tiny-qwen3.gguf"
    write_tiny_gguf(path, "qwen3")
    llm = _llm(str(path), kv_cache_memory=64 << 20, enable_lora=True, max_loras=3)
    model = llm.engine.runner.model
    assert model.cpu_decoder is not None and model.cpu_decoder.lora is model.lora
    shapes, layers = model.lora.shapes(), model.config.num_layers
    targets = [None, ["q_proj", "v_proj", "down_proj"], ["k_proj", "o_proj", "up_proj"]]
    loras = [LoRARequest(f"a{i}", i, str(write_random_adapter(root / f"a{i}", shapes, layers, i,
                                                              r=4 * i, targets=targets[i - 1])))
             for i in (1, 2, 3)]  # fmt: skip
    prompts = _prompts(8, seed=11, low=3, high=VOCAB)
    return path, loras, prompts, llm


def _alone(llm, prompts, adapters):
    return [_ids(llm.generate([p], GREEDY, use_tqdm=False, lora_request=a))[0]
            for p, a in zip(prompts, adapters)]  # fmt: skip


def test_mixed_adapters_in_one_batch_match_each_alone(tiny):
    _, loras, prompts, llm = tiny
    adapters = [([None] + loras)[i % 4] for i in range(len(prompts))]
    alone = _alone(llm, prompts, adapters)
    base = _alone(llm, prompts, [None] * len(prompts))
    changed = [alone[i] != base[i] for i in range(len(prompts)) if adapters[i] is not None]
    assert all(changed), "every adapter changes its prompts' greedy tokens"
    llm.engine.kv.reset_prefix_cache()
    together = _ids(llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=adapters))
    assert together == alone


def test_one_slot_serves_three_adapters_in_turn(tiny):
    path, loras, prompts, llm = tiny
    adapters = [loras[i % 3] for i in range(6)]
    expected = _alone(llm, prompts[:6], adapters)
    one = _llm(str(path), kv_cache_memory=64 << 20, enable_lora=True, max_loras=1,
               max_cpu_loras=2)  # fmt: skip
    got = _ids(one.generate(prompts[:6], GREEDY, use_tqdm=False, lora_request=adapters))
    assert got == expected
    assert one.engine.runner.model.lora.resident  # slot 1 holds the last adapter served
    assert len(one.engine.runner.adapter_cache.adapters) == 2  # max_cpu_loras


def test_prefix_cache_is_not_shared_across_adapters(tiny):
    _, loras, prompts, llm = tiny
    prompt = prompts[0] * 3  # several full blocks
    llm.engine.kv.reset_prefix_cache()
    llm.generate([prompt], GREEDY, use_tqdm=False, lora_request=loras[0])
    again = llm.generate([prompt], GREEDY, use_tqdm=False, lora_request=loras[0])[0]
    other = llm.generate([prompt], GREEDY, use_tqdm=False, lora_request=loras[1])[0]
    base = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    assert again.num_cached_tokens > 0
    assert other.num_cached_tokens == 0 and base.num_cached_tokens == 0


def test_c_layer_agrees_with_the_pytorch_layers_under_an_adapter(tiny):
    _, loras, prompts, llm = tiny
    model = llm.engine.runner.model
    slot = llm.engine.scheduler.adapters.acquire(loras[0])
    llm.engine.runner.load_adapters(llm.engine.scheduler.adapters.take_loads())
    from test_lora_parity import greedy_with_adapters

    decoder = model.cpu_decoder
    try:
        c_path = greedy_with_adapters(model, prompts[:4], [slot, 0, slot, 0], 8, backend="cpu")
        model.cpu_decoder = None
        torch_path = greedy_with_adapters(model, prompts[:4], [slot, 0, slot, 0], 8,
                                          backend="cpu")  # fmt: skip
    finally:
        model.cpu_decoder = decoder
        llm.engine.scheduler.adapters.release(slot)
    assert c_path == torch_path


def test_speculation_and_forks_keep_the_adapter(tiny):
    path, loras, prompts, llm = tiny
    repeating = _repeating(6, 6, 3, VOCAB)
    adapters = [loras[i % 3] if i % 4 else None for i in range(len(repeating))]
    long = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    expected = [_ids(llm.generate([p], long, use_tqdm=False, lora_request=a))[0]
                for p, a in zip(repeating, adapters)]  # fmt: skip
    spec = _llm(str(path), kv_cache_memory=64 << 20, enable_lora=True, max_loras=3,
                speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                    "prompt_lookup_max": 3, "prompt_lookup_min": 2})  # fmt: skip
    spec.engine.speculation.adaptive = False  # verify every draft found
    got = _ids(spec.generate(repeating, long, use_tqdm=False, lora_request=adapters))
    assert got == expected
    assert spec.engine.speculation.metrics.num_draft_tokens > 0
    two = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, n=2)
    outs = llm.generate(repeating, two, use_tqdm=False, lora_request=adapters)
    assert [[c.token_ids for c in o.outputs] for o in outs] == [[e, e] for e in expected]


def test_an_adapter_that_does_not_fit_is_the_requests_error(tiny, tmp_path):
    from inferd.errors import InvalidRequest

    _, _, prompts, llm = tiny
    wrong = {**llm.engine.runner.model.lora.shapes(), "q_proj": (8, 8)}
    folder = write_random_adapter(tmp_path / "wrong", wrong, 2, seed=0, targets=["q_proj"])
    with pytest.raises(InvalidRequest, match="q_proj"):
        llm.generate([prompts[0]], GREEDY, use_tqdm=False,
                     lora_request=LoRARequest("wrong", 9, str(folder)))  # fmt: skip
    assert not llm.engine.scheduler.requests  # nothing was queued


@pytest.mark.slow
def test_embedded_gemma_mixed_adapters_match_each_alone(tmp_path, c_kernels):
    """The same on the embedded Gemma 3 270M (sandwich norms, Q4_K/Q5_0/Q6_K blocks): two rank-16
    adapters on every projection and the base model in one batch."""
    llm = _llm(None, kv_cache_memory=128 << 20, enable_lora=True, max_loras=2)
    model = llm.engine.runner.model
    assert model.cpu_decoder is not None
    shapes, layers = model.lora.shapes(), model.config.num_layers
    loras = [LoRARequest(f"g{i}", i, str(write_random_adapter(tmp_path / f"g{i}", shapes, layers,
                                                              i, r=16)))
             for i in (1, 2)]  # fmt: skip
    prompts = _prompts(3, seed=2)
    adapters = [None, *loras]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    alone = [_ids(llm.generate([p], params, use_tqdm=False, lora_request=a))[0]
             for p, a in zip(prompts, adapters)]  # fmt: skip
    base = [_ids(llm.generate([p], params, use_tqdm=False))[0] for p in prompts[1:]]
    assert alone[1:] != base
    llm.engine.kv.reset_prefix_cache()
    assert _ids(llm.generate(prompts, params, use_tqdm=False, lora_request=adapters)) == alone
