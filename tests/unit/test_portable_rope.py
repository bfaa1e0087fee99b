"""The C kernels' RoPE frequencies (rotary.portable_inv_frequencies): HF's values within a few
units of the last bit (HF rounds each float32 step of a scaling, these once), for every scaling
inferd reads, from arithmetic that PyTorch's vector width cannot change
(tests/parity/test_cpu_independence.py checks the whole model)."""

from __future__ import annotations

import pytest
import torch

from inferd.config import RopeConfig
from inferd.layers.rotary import inv_frequencies, portable_inv_frequencies

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}  # fmt: skip
CONFIGS = [
    (256, RopeConfig(10000.0)),
    (256, RopeConfig(1000000.0)),
    (64, RopeConfig(500000.0, LLAMA3)),
    (128, RopeConfig(10000.0, {"rope_type": "linear", "factor": 4.0})),
    (32, RopeConfig(10000.0, {"rope_type": "freq_factors", "factors": [1.0] * 8 + [4.0] * 8})),
]


@pytest.mark.parametrize("head_dim,rope", CONFIGS, ids=["10k", "1M", "llama3", "linear", "factors"])
def test_portable_frequencies_are_hf_within_a_few_units_of_the_last_bit(head_dim, rope):
    portable, hf = portable_inv_frequencies(head_dim, rope), inv_frequencies(head_dim, rope)
    assert portable.dtype == torch.float32 and portable.shape == (head_dim // 2,)
    ulp = torch.finfo(torch.float32).eps * hf.abs()
    assert ((portable - hf).abs() <= 4 * ulp).all()


def test_portable_frequencies_are_the_correctly_rounded_powers():
    # float64 powers one at a time in Python (glibc's pow), then float32: the same values
    exact = [1.0 / 10000.0 ** (i / 256) for i in range(0, 256, 2)]
    expected = torch.tensor(exact, dtype=torch.float64).float()
    assert torch.equal(portable_inv_frequencies(256, RopeConfig(10000.0)), expected)
