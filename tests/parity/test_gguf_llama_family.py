"""The gguf mode on Llama, Qwen2 (q/k/v bias) and Qwen3 (q/k norms) GGUF files: tiny random
models written with the `gguf` package (tests/tiny_gguf.py), quantised to Q8_0, Q5_0, Q4_0 and
Q4_1 (every storage width of gguf_blocks, with and without offsets).

* The gguf mode's logits follow the float32 run of the same file (which dequantises every
  weight), within the rounding of activations to int8.
* Its one-call decoder layer (decode_layer.c: SiLU, no sandwich norms, bias, q/k norms here),
  which runs the prefill and every decode step, gives what the same layers compute op by op in
  PyTorch.
"""

from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest
import torch
from tiny_gguf import VOCAB, write_tiny_gguf

from inferd.attention.cpu_backend import CpuAttentionBackend
from inferd.engine.execution.runner import ModelRunner, SequenceStep
from inferd.loader.checkpoint import open_checkpoint
from inferd.loader.model_loader import load_model


def run(model, ids: list[int], decode_steps: int, backend=None, cache=torch.float32,
        runners: list | None = None) -> torch.Tensor:  # fmt: skip
    """Logits of a prefill of ids[:-decode_steps] (last position) and of each decode step (the
    runner, whose cache holds the step's keys and values, appended to `runners`)."""
    runner = ModelRunner(model, [64] * len(model.config.kv_groups()), 16, cache,
                         torch.device("cpu"), backend)  # fmt: skip
    if runners is not None:
        runners.append(runner)
    tables = [list(range(1, 9))] * len(runner.kv_caches)
    prompt = len(ids) - decode_steps
    out = [runner.execute_with_prompt_logits([SequenceStep(ids[:prompt], 0, tables)])[0]]
    for pos in range(prompt, len(ids)):
        out.append(runner.execute_with_prompt_logits([SequenceStep(ids[pos : pos + 1], pos,
                                                                   tables)])[0])  # fmt: skip
    return torch.cat(out).float()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_gguf_mode_matches_float32_and_its_fused_layers(tmp_path, monkeypatch, c_kernels, arch):
    monkeypatch.setenv("INFERD_WEIGHT_CACHE", "0")  # tiny files: keep them out of the user's cache
    path = tmp_path / f"tiny-{arch}.gguf"
    write_tiny_gguf(path, arch)
    ids = [int(i) for i in np.random.default_rng(1).integers(0, VOCAB, 24)]
    reference = run(load_model(open_checkpoint(path), torch.float32, torch.device("cpu")), ids, 6)

    model = load_model(open_checkpoint(path), torch.float32, torch.device("cpu"), "gguf")
    assert model.cpu_decoder is not None
    decoder, served = model.cpu_decoder, []
    real_serves = decoder.serves
    decoder.serves = lambda ctx: served.append(real_serves(ctx)) or served[-1]
    fused = run(model, ids, 6, CpuAttentionBackend(c_kernels))
    assert served == [True] * 7  # the prefill and every decode step
    scale = reference.abs().max()
    assert (fused - reference).abs().max() < 0.03 * scale

    op_by_op = run(model, ids, 6)  # the torch backend: the layers' own forward
    assert len(served) == 7 + 7 and not any(served[7:])
    assert (fused - op_by_op).abs().max() < 1e-3 * scale


@pytest.mark.slow
def test_the_c_decoder_writes_and_reads_a_bf16_cache(tmp_path, monkeypatch, c_kernels):
    """`--kv-cache-dtype bfloat16` on blocks: the C layer rounds keys and values to bf16 as
    PyTorch does (to nearest even) and attends over them; the layers op by op (storing with
    PyTorch, attending with the same C kernel) agree, and both stay near the float32 cache's
    logits."""
    monkeypatch.setenv("INFERD_WEIGHT_CACHE", "0")
    path = tmp_path / "tiny-llama.gguf"
    write_tiny_gguf(path, "llama")
    ids = [int(i) for i in np.random.default_rng(3).integers(0, VOCAB, 20)]
    model = load_model(open_checkpoint(path), torch.float32, torch.device("cpu"), "gguf")
    served, real_serves = [], model.cpu_decoder.serves
    model.cpu_decoder.serves = lambda ctx: served.append(real_serves(ctx)) or served[-1]
    cpu, runners = CpuAttentionBackend(c_kernels), []
    fused = run(model, ids, 4, cpu, torch.bfloat16, runners)
    assert served == [True] * 5
    full = run(model, ids, 4, cpu)
    decoder, model.cpu_decoder = model.cpu_decoder, None
    op_by_op = run(model, ids, 4, cpu, torch.bfloat16, runners)
    model.cpu_decoder = decoder
    c_cache, torch_cache = (r.kv_caches[0][0][:, 1:3].float() for r in runners)
    assert c_cache.abs().sum() > 0  # the 20 tokens' keys and values, in blocks 1 and 2
    # the same values rounded the same way; only a float rounding apart now and then
    assert (c_cache == torch_cache).float().mean() > 0.99
    scale = full.abs().max()
    assert (fused - op_by_op).abs().max() < 1e-3 * scale
    assert 0 < (fused - full).abs().max() < 0.03 * scale  # bf16 keys and values: close, not equal


@pytest.mark.slow
def test_block_cache_restores_the_same_model(tmp_path, monkeypatch, c_kernels):
    from inferd.loader import gguf_cache

    monkeypatch.setenv("INFERD_CACHE", str(tmp_path / "cache"))
    loads = []  # what each install from an entry (written now, or found) replaced
    real_install = gguf_cache._install

    def install(*args):
        loads.append(real_install(*args))
        return loads[-1]

    monkeypatch.setattr(gguf_cache, "_install", install)
    path = tmp_path / "tiny-qwen2.gguf"
    write_tiny_gguf(path, "qwen2")
    ids = [int(i) for i in np.random.default_rng(2).integers(0, VOCAB, 16)]

    models = []

    def logits(dtype=torch.float32):
        models.append(load_model(open_checkpoint(path), dtype, torch.device("cpu"), "gguf"))
        return run(models[-1], ids, 4)

    first = logits()  # unpacks the file and writes the cache
    # ... then serves from the entry: the C decoder's layers point into it, not at the blocks
    # the load packed (freed once replaced)
    (memory,) = models[0]._block_cache_mmaps
    start = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    layers = models[0].cpu_decoder.layers
    assert layers and all(start <= layer.spec.qkv.parts[0].q < start + len(memory)
                          for layer in layers)  # fmt: skip
    (cached,) = (tmp_path / "cache" / "weights").glob("*.safetensors")
    info = json.loads(cached.with_suffix(".json").read_text())
    assert info["mode"].startswith("gguf-blocks") and info["model"] == str(path)
    # the blocks, about the file's size (a float32 copy would be ~6x it)
    assert info["bytes"] == cached.stat().st_size < 1.5 * path.stat().st_size
    # the first load, too, serves from the entry it wrote (huge_pages.py moves that memory)
    assert len(loads) == 1 and len(loads[0]) > 0
    assert torch.equal(logits(), first)
    assert loads[1] == loads[0]  # a warm start: the entry, no unpacking
    logits(torch.bfloat16)  # another dtype: the same entry (blocks do not depend on it)
    assert len(loads) == 3 and loads[2] == loads[0]
    assert len(list(cached.parent.glob("*.safetensors"))) == 1
    cached.write_bytes(cached.read_bytes()[:4096])  # a damaged cache is ignored, then rewritten
    assert torch.equal(logits(), first)
    assert loads[3] == loads[0]  # refused (not installed), then the entry written again
    assert torch.equal(logits(), first)
    assert len(loads) == 5 and loads[4] == loads[0]
