"""A verification step (the last token and its drafts, `SequenceStep.verify`) on tiny random
models: its k + 1 logits rows are those of decoding the same tokens one step at a time, with both
attention backends, past the sliding window, and it leaves the KV cache as those steps would."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_tiny_checkpoint

from inferd.attention.torch_backend import TorchAttentionBackend
from inferd.engine.execution.runner import ModelRunner, SequenceStep
from inferd.loader import load_model, open_checkpoint

PROMPT = [1, 17, 250, 33, 98, 5, 77, 120, 200, 41, 9]  # longer than gemma3's window of 6
TOKENS = [63, 150, 88, 12, 230]  # the last token and four drafts


def backends():
    """The torch backend, and the cpu one (decode attention in C) where the kernels build."""
    yield TorchAttentionBackend()
    from inferd.cpu_kernels import build

    try:
        lib = build.kernel_library()
    except build.KernelsUnavailable:
        return
    from inferd.attention.cpu_backend import CpuAttentionBackend

    yield CpuAttentionBackend(lib)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {kind: load_model(open_checkpoint(make_tiny_checkpoint(kind, root / kind)),
                             torch.float32, torch.device("cpu"))
            for kind in ("gemma3", "llama")}  # fmt: skip


def runner_for(model, backend) -> tuple[ModelRunner, list[list[int]]]:
    groups = len(model.config.kv_groups())
    runner = ModelRunner(model, [32] * groups, 4, torch.float32, torch.device("cpu"), backend)
    tables = [[5, 2, 9, 7, 11, 3, 8]] * groups  # non-contiguous blocks
    runner.execute([SequenceStep(PROMPT, 0, tables, needs_logits=False)])
    return runner, tables


@pytest.mark.parametrize("kind", ["gemma3", "llama"])
def test_verification_rows_equal_one_token_steps(models, kind):
    model = models[kind]
    for backend in backends():
        one_by_one, tables = runner_for(model, backend)
        expected = torch.cat([
            one_by_one.execute([SequenceStep([t], len(PROMPT) + j, tables)])
            for j, t in enumerate(TOKENS)
        ])  # fmt: skip
        verifier, tables = runner_for(model, backend)
        step = SequenceStep(TOKENS, len(PROMPT), tables, verify=True)
        got = verifier.execute([step])
        assert got.shape == (len(TOKENS), model.config.vocab_size)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        # The cache holds what the one-token steps wrote: the next step agrees as well.
        after = SequenceStep([4], len(PROMPT) + len(TOKENS), tables)
        torch.testing.assert_close(verifier.execute([after]), one_by_one.execute([after]),
                                   rtol=1e-5, atol=1e-5)  # fmt: skip


def test_a_batch_mixes_verification_prefill_and_decode(models):
    model = models["gemma3"]
    runner, tables = runner_for(model, TorchAttentionBackend())
    other = [[20, 21, 22, 23, 24]] * len(tables)
    steps = [
        SequenceStep(TOKENS[:3], len(PROMPT), tables, verify=True),
        SequenceStep([7, 8, 9, 10, 11, 12, 13], 0, other),  # a prompt: last row only
    ]
    got = runner.execute(steps)
    assert got.shape == (4, model.config.vocab_size)
    alone, tables = runner_for(model, TorchAttentionBackend())
    torch.testing.assert_close(got[:3], alone.execute([steps[0]]), rtol=1e-5, atol=1e-5)
