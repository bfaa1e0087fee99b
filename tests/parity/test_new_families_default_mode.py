"""Gemma 2, Granite and OLMo 2 beyond the greedy parity of test_family_parity.py:

* a prompt's float32 logits from the GGUF file equal HF's, for the two families whose last
  step changes the logits but never their argmax (Gemma 2's final soft-cap, Granite's
  `logits_scaling`: read from llama.cpp's metadata keys; test_tiny_parity.py checks the logits
  from the HF folders);
* the default mode (no dtype given) gives each prompt the same greedy tokens alone and in a
  batch of all: Granite from its HF folder (dense weights), Gemma 2 from a Q8_0 GGUF file (its
  blocks, every step in the C decoder layer: soft-capped scores, sliding windows, sandwich
  norms).
* Granite's residual multiplier in the C decoder layer: with every step in C, the logits equal
  those of the same GGUF blocks through the layers' own forward, to rounding, and are the same
  bits in every kernel variant this CPU runs (natively or emulated, tests/kernel_variants.py).
"""

from __future__ import annotations

import pytest
import torch
from hf_to_gguf import write_gguf
from kernel_variants import available_variants, use_variant
from logits_probe import step_logits
from test_family_parity import PROMPTS
from tiny_models import hf_greedy, make_tiny_checkpoint, make_tiny_model

from inferd import LLM, SamplingParams
from inferd.attention.cpu_backend import CpuAttentionBackend
from inferd.engine.execution.runner import ModelRunner, SequenceStep
from inferd.layers.weight_scheme import WeightScheme
from inferd.loader import load_model, open_checkpoint

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def _prompt_logits(path, prompts: list[list[int]]) -> torch.Tensor:
    """Last-position float32 logits of each prompt, all prefilled in one step."""
    model = load_model(open_checkpoint(path), torch.float32, torch.device("cpu"))
    blocks, size = 16, 4
    runner = ModelRunner(model, [blocks * len(prompts) + 1] * len(model.config.kv_groups()),
                         size, torch.float32, torch.device("cpu"))  # fmt: skip
    tables = [[list(range(1 + i * blocks, 1 + (i + 1) * blocks))] * len(model.config.kv_groups())
              for i in range(len(prompts))]  # fmt: skip
    return runner.execute([SequenceStep(p, 0, t) for p, t in zip(prompts, tables)])


@pytest.mark.parametrize("kind", ["gemma2", "granite"])
def test_gguf_prompt_logits_match_hf(kind, tmp_path):
    overrides = {"query_pre_attn_scalar": 32} if kind == "gemma2" else {}  # GGUF's query scale
    model = make_tiny_model(kind, tmp_path / kind, **overrides)
    expected = torch.stack([hf_greedy(model, p, 0)[0] for p in PROMPTS])
    if kind == "gemma2":  # the cap bounds the logits, and binds: HF's reach near it
        assert expected.abs().max() < 3.0 and expected.abs().max() > 2.5
    path = write_gguf(model, kind, tmp_path / f"{kind}.gguf")
    torch.testing.assert_close(_prompt_logits(path, PROMPTS), expected, atol=1e-4, rtol=1e-4)


def _alone_and_together(llm: LLM, prompts: list[list[int]]) -> tuple[list, list]:
    alone = [llm.generate([p], GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    together = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    return alone, together


def test_default_mode_hf_folder_batch_invariance(tmp_path):
    folder = make_tiny_checkpoint("granite", tmp_path / "granite")
    llm = LLM(model=str(folder), kv_cache_memory=64 << 20)
    assert llm.engine.runner.model.cpu_decoder is None  # HF weights: the layers' own forward
    alone, together = _alone_and_together(llm, PROMPTS)
    assert together == alone


def test_default_mode_quantized_gguf_batch_invariance(tmp_path, monkeypatch, c_kernels):
    monkeypatch.setenv("INFERD_WEIGHT_CACHE", "0")  # a test file's blocks stay out of the cache
    model = make_tiny_model("gemma2", tmp_path / "hf")
    path = write_gguf(model, "gemma2", tmp_path / "gemma2.gguf", quantize=True, vocab=True)
    llm = LLM(model=str(path), kv_cache_memory=64 << 20)
    assert llm.engine.runner.model.cpu_decoder is not None  # every step in the C layer
    alone, together = _alone_and_together(llm, PROMPTS)
    assert together == alone
    assert len({tuple(ids) for ids in alone}) > 1  # the prompts lead somewhere different


def _steps_logits(model, lib, prompts: list[list[int]], decode_steps: int = 3) -> torch.Tensor:
    """Logits of a prefill of all prompts, then of decode steps (next tokens fixed), attended
    by the cpu backend in its fixed-order mode: the steps the C decoder layer serves."""
    runner = ModelRunner(model, [64 * len(prompts) + 1], 4, torch.float32, torch.device("cpu"),
                         backend=CpuAttentionBackend(lib))  # fmt: skip
    tables = [[list(range(1 + 16 * i, 17 + 16 * i))] for i in range(len(prompts))]
    out = [runner.execute([SequenceStep(p, 0, t) for p, t in zip(prompts, tables)])]
    for step in range(decode_steps):
        rows = [SequenceStep([10 + step], len(p) + step, t) for p, t in zip(prompts, tables)]
        out.append(runner.execute(rows))
    return torch.cat(out)


def test_granite_residual_multiplier_in_the_c_layer(tmp_path, monkeypatch, c_kernels):
    monkeypatch.setenv("INFERD_WEIGHT_CACHE", "0")
    hf = make_tiny_model("granite", tmp_path / "hf")
    path = write_gguf(hf, "granite", tmp_path / "granite.gguf", quantize=True)
    scheme = WeightScheme("gguf", torch.float32, blocks=True, kernels=c_kernels)
    models = [load_model(open_checkpoint(path), torch.float32, torch.device("cpu"), scheme=scheme)
              for _ in range(2)]  # fmt: skip
    in_c, layers = models
    assert in_c.cpu_decoder is not None
    calls = []
    run = in_c.cpu_decoder.run
    in_c.cpu_decoder.run = lambda *a: calls.append(1) or run(*a)
    layers.cpu_decoder = None  # the same blocks through each layer's forward
    got = _steps_logits(in_c, c_kernels, PROMPTS)
    expected = _steps_logits(layers, c_kernels, PROMPTS)
    assert len(calls) == 4  # every step in C
    assert ((got - expected).abs().max() / expected.abs().max()).item() < 1e-3


def test_granite_c_layer_same_bits_in_every_kernel_variant(tmp_path, monkeypatch, c_kernels):
    here = available_variants()
    if here == ["portable"]:
        pytest.skip("only the portable kernels run (or are emulated) here: nothing to compare")
    monkeypatch.setenv("INFERD_WEIGHT_CACHE", "0")
    hf = make_tiny_model("granite", tmp_path / "hf")
    path = write_gguf(hf, "granite", tmp_path / "granite.gguf", quantize=True, vocab=True)
    logits = {}
    for name in here:
        with pytest.MonkeyPatch.context() as patch:
            use_variant(patch, name)
            llm = LLM(model=str(path), kv_cache_memory=16 << 20)
            assert llm.engine.runner.model.cpu_decoder is not None
            logits[name] = step_logits(llm, PROMPTS[:3])
    assert len(logits["portable"]) == 6  # a step per generated token
    same = [all(map(torch.equal, logits[n], logits["portable"])) for n in here]
    assert all(same), f"{[n for n, s in zip(here, same) if not s]} differ from portable"
