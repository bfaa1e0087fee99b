"""`--deterministic` (`LLM(deterministic=True)`) on dense checkpoints, on tiny random HF models
(Gemma 3: sliding window, q/k norms, sandwich norms; Llama) in float32 and bfloat16: a prompt's
logits are the same bits alone, in a step with every other prompt and prefilled in chunks of 7
tokens, and its greedy tokens alone equal those in a batch and prefilled in chunks of 16
tokens. The start-up line says which mode runs."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_models import make_tiny_checkpoint

from inferd import LLM, SamplingParams
from inferd.engine.execution.runner import SequenceStep

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {kind: make_tiny_checkpoint(kind, root / kind) for kind in ("gemma3", "llama")}


def _ids(outs):
    return [o.outputs[0].token_ids for o in outs]


def _last_logits(llm: LLM, prompts: list[list[int]], together: bool, chunk: int = 0):
    """Each prompt's last-position logits, teacher-forced through the runner: all prompts in
    one step, or each alone (in chunks of `chunk` tokens, if given)."""
    runner = llm.engine.runner
    tables = [
        [list(range(1 + 8 * i, 9 + 8 * i))] * len(runner.kv_caches) for i in range(len(prompts))
    ]
    for t in tables:
        runner.clear_blocks(t)
    if together:
        return runner.execute([SequenceStep(p, 0, t) for p, t in zip(prompts, tables)])
    rows = []
    for p, t in zip(prompts, tables):
        step = chunk or len(p)
        for a in range(0, len(p), step):
            logits = runner.execute([SequenceStep(p[a : a + step], a, t)])
        rows.append(logits)
    return torch.cat(rows)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gemma3", "llama"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dense_rows_do_not_depend_on_their_step(checkpoints, c_kernels, capsys, kind, dtype):
    rng = random.Random(1)
    prompts = [[1] + [rng.randrange(4, 290) for _ in range(rng.randrange(2, 60))]
               for _ in range(10)]  # fmt: skip
    flags = dict(model=str(checkpoints[kind]), dtype=dtype, deterministic=True,
                 kv_cache_memory=16 << 20)  # fmt: skip
    llm = LLM(**flags)
    line = f"{dtype}: dense {dtype} weights, 16-row tiles (--deterministic)"
    assert line in capsys.readouterr().err
    assert llm.engine.runner.backend.fixed_order
    each = _last_logits(llm, prompts, together=False)
    assert torch.equal(_last_logits(llm, prompts, together=True), each)
    assert torch.equal(_last_logits(llm, prompts, together=False, chunk=7), each)
    alone = [_ids(llm.generate([p], GREEDY, use_tqdm=False))[0] for p in prompts]
    assert _ids(llm.generate(prompts, GREEDY, use_tqdm=False)) == alone
    chunked = LLM(**flags, max_num_batched_tokens=16)
    assert _ids(chunked.generate(prompts, GREEDY, use_tqdm=False)) == alone
