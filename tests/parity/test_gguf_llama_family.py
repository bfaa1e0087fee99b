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

import json

import numpy as np
import pytest
import torch
from tiny_gguf import VOCAB, write_tiny_gguf

from inferd.attention.cpu_backend import CpuAttentionBackend
from inferd.engine.runner import ModelRunner, SequenceStep
from inferd.loader.checkpoint import open_checkpoint
from inferd.loader.model_loader import load_model


def run(model, ids: list[int], decode_steps: int, backend=None) -> torch.Tensor:
    """Logits of a prefill of ids[:-decode_steps] (last position) and of each decode step."""
    runner = ModelRunner(model, [64] * len(model.config.kv_groups()), 16, torch.float32,
                         torch.device("cpu"), backend)  # fmt: skip
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
def test_block_cache_restores_the_same_model(tmp_path, monkeypatch, c_kernels):
    from inferd.loader import gguf_cache

    monkeypatch.setenv("INFERD_CACHE", str(tmp_path / "cache"))
    loads = []
    real_restore = gguf_cache._restore

    def restore(model, entry):
        loads.append(real_restore(model, entry))
        return loads[-1]

    monkeypatch.setattr(gguf_cache, "_restore", restore)
    path = tmp_path / "tiny-qwen2.gguf"
    write_tiny_gguf(path, "qwen2")
    ids = [int(i) for i in np.random.default_rng(2).integers(0, VOCAB, 16)]

    def logits(dtype=torch.float32):
        return run(load_model(open_checkpoint(path), dtype, torch.device("cpu"), "gguf"), ids, 4)

    first = logits()  # unpacks the file and writes the cache
    (cached,) = (tmp_path / "cache" / "weights").glob("*.safetensors")
    info = json.loads(cached.with_suffix(".json").read_text())
    assert info["mode"].startswith("gguf-blocks") and info["model"] == str(path)
    # the blocks, about the file's size (a float32 copy would be ~6x it)
    assert info["bytes"] == cached.stat().st_size < 1.5 * path.stat().st_size
    assert loads == []
    assert torch.equal(logits(), first)
    hit = loads == [frozenset(loads[0])] and len(loads[0]) > 0
    assert hit, loads
    logits(torch.bfloat16)  # another dtype: the same entry (blocks do not depend on it)
    assert len(loads) == 2 and loads[1] == loads[0]
    assert len(list(cached.parent.glob("*.safetensors"))) == 1
    cached.write_bytes(cached.read_bytes()[:4096])  # a damaged cache is ignored, then rewritten
    assert torch.equal(logits(), first)
    assert loads[2] is None
    assert torch.equal(logits(), first)
    assert loads[3] == loads[0]
