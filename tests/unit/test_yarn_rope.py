"""YaRN RoPE (layers/rotary.py) against transformers' own rope init and rotary modules: the
frequencies bit for bit, the attention factor (from `factor`, from DeepSeek's mscales, or
given), the cos/sin tables scaled by it; the C kernels' portable frequencies and tables close
to them; config.json's YaRN read for any family (gpt-oss, Qwen2's transformers 4 spelling),
and a bad one refused by name."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from inferd.config import RopeConfig
from inferd.errors import ModelLoadError
from inferd.layers.rotary import (
    RotaryEmbedding,
    inv_frequencies,
    kernel_cos_sin,
    portable_inv_frequencies,
    yarn_magnitude,
)
from inferd.loader.hf_config import model_config_from_hf

HEAD_DIM = 64
# rope_parameters as transformers 5 writes them (with rope_theta)
CASES = {
    "gpt-oss": dict(rope_theta=150000.0, factor=32.0, beta_fast=32.0, beta_slow=1.0,
                    truncate=False, original_max_position_embeddings=4096),
    "qwen": dict(rope_theta=1e6, factor=4.0, original_max_position_embeddings=32768),
    "truncated": dict(rope_theta=10000.0, factor=8.0, beta_fast=16.0, beta_slow=2.0,
                      original_max_position_embeddings=512),
    "attention-factor": dict(rope_theta=10000.0, factor=8.0, attention_factor=0.9,
                             original_max_position_embeddings=512),
    "mscale": dict(rope_theta=10000.0, factor=40.0, mscale=1.0, mscale_all_dim=0.707,
                   original_max_position_embeddings=4096),
}  # fmt: skip


def _hf_config(params: dict):
    """A config transformers' YaRN reads (its max_position_embeddings = factor x original:
    no warning about an implicit factor)."""
    return transformers.Qwen2Config(
        hidden_size=4 * HEAD_DIM, num_attention_heads=4,
        max_position_embeddings=int(params["factor"] * params["original_max_position_embeddings"]),
        rope_parameters={"rope_type": "yarn", **params},
    )  # fmt: skip


def _rope(params: dict) -> RopeConfig:
    scaling = {"rope_type": "yarn", **{k: v for k, v in params.items() if k != "rope_theta"}}
    return RopeConfig(params["rope_theta"], scaling)


@pytest.mark.parametrize("case", CASES)
def test_frequencies_and_attention_factor_are_transformers(case):
    params = CASES[case]
    inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](_hf_config(params))
    assert torch.equal(inv_frequencies(HEAD_DIM, _rope(params)), inv_freq)
    assert yarn_magnitude(_rope(params)) == factor
    # the C kernels' frequencies: the same within float32's rounding of the powers
    portable = portable_inv_frequencies(HEAD_DIM, _rope(params))
    torch.testing.assert_close(portable, inv_freq, rtol=1e-6, atol=0)


def test_the_ramp_sits_between_interpolation_and_extrapolation():
    """Not a vacuous case: high frequencies kept, low ones divided by the factor."""
    params = CASES["gpt-oss"]
    plain = inv_frequencies(HEAD_DIM, RopeConfig(params["rope_theta"]))
    yarn = inv_frequencies(HEAD_DIM, _rope(params))
    assert torch.equal(yarn[:2], plain[:2])
    torch.testing.assert_close(yarn[-4:], plain[-4:] / 32.0)
    ratio = plain / yarn
    assert ((ratio > 1.01) & (ratio < 31.9)).any()


@pytest.mark.parametrize("case", ["gpt-oss", "qwen"])
def test_tables_are_the_rotary_module_s(case):
    """cos and sin scaled by the attention factor as HF's module does (inferd's sin is signed
    for its rotation: the first half negated)."""
    config = _hf_config(CASES[case])
    module = transformers.models.qwen2.modeling_qwen2.Qwen2RotaryEmbedding(config)
    positions = torch.tensor([0, 1, 7, 100, 4095, 70000])
    cos, sin = module(torch.zeros(1, dtype=torch.float32), positions[None])
    ours = RotaryEmbedding(HEAD_DIM, _rope(CASES[case]))
    our_cos, our_sin = ours.cos_sin(positions, torch.float32)
    assert ours.magnitude > 1
    assert torch.equal(our_cos[:, 0], cos[0])
    half = HEAD_DIM // 2
    assert torch.equal(our_sin[:, 0, half:], sin[0, :, half:])
    assert torch.equal(our_sin[:, 0, :half], -sin[0, :, :half])


def test_the_c_kernel_tables_carry_the_magnitude(c_kernels):
    rotary = RotaryEmbedding(HEAD_DIM, _rope(CASES["gpt-oss"]))
    positions = torch.arange(0, 3000, 7)
    cos, sin = kernel_cos_sin(c_kernels, rotary.portable_inv_freq, positions, rotary.magnitude)
    ref_cos, ref_sin = rotary.cos_sin(positions, torch.float32)
    torch.testing.assert_close(cos, ref_cos[:, 0], rtol=0, atol=2e-4)
    torch.testing.assert_close(sin, ref_sin[:, 0], rtol=0, atol=2e-4)
    plain, _ = kernel_cos_sin(c_kernels, rotary.portable_inv_freq, positions)
    assert torch.equal(cos, plain * rotary.magnitude)  # one product per value
    # a position's table does not depend on the step's other positions
    one, _ = kernel_cos_sin(c_kernels, rotary.portable_inv_freq, positions[5:6], rotary.magnitude)
    assert torch.equal(one, cos[5:6])


def _config_json(**extra) -> dict:
    cfg = dict(architectures=["Qwen2ForCausalLM"], vocab_size=100, hidden_size=64,
               intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)  # fmt: skip
    return {**cfg, **extra}


def test_config_json_yarn_in_both_spellings():
    v4 = _config_json(rope_theta=1e6, rope_scaling={
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})  # fmt: skip
    v5 = _config_json(rope_parameters={"rope_type": "yarn", **CASES["qwen"]})
    for cfg in (v4, v5):
        rope = model_config_from_hf(cfg).rope
        assert rope.theta == 1e6 and yarn_magnitude(rope) == pytest.approx(1.1386294)
        assert torch.equal(inv_frequencies(16, rope), inv_frequencies(16, _rope(CASES["qwen"])))


@pytest.mark.parametrize("bad, key", [
    ({"factor": 4.0}, "original_max_position_embeddings"),
    ({"original_max_position_embeddings": 64}, "factor"),
    ({"factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": "x"}, "beta_fast"),
    ({"factor": 4.0, "original_max_position_embeddings": 64, "truncate": 1}, "truncate"),
])  # fmt: skip
def test_a_bad_yarn_config_is_refused_by_name(bad, key):
    cfg = _config_json(rope_scaling={"rope_type": "yarn", **bad})
    with pytest.raises(ModelLoadError, match=key):
        model_config_from_hf(cfg)
