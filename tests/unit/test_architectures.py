"""The Architecture records and their registry: one record per model file, names that lead to
exactly one record, a new family added as one module and one FAMILIES entry, and the tensor
layouts (fused, packed, renamed) turned into the one layout the modules load."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from inferd.config import ModelConfig, MoEConfig
from inferd.loader.hf_config import model_config_from_hf
from inferd.loader.tensor_layout import RowsView, normalized, normalized_shapes
from inferd.models import registry
from inferd.models.architecture import Architecture
from inferd.models.llama import LlamaForCausalLM

NO_C_LAYER = {"olmo2"}  # dense families whose math the C decoder layer lacks


def test_every_model_file_has_one_record_and_names_lead_to_one_record():
    records = registry.records()
    assert len(records) == len(registry.FAMILIES)
    classes = [c for r in records.values() for c in r.hf_classes]
    assert len(classes) == len(set(classes))
    gguf = [(n, r.moe) for r in records.values() for n in r.gguf_names]
    assert len(gguf) == len(set(gguf))  # a GGUF name serves at most one dense and one MoE family
    for record in records.values():
        # the C layer has no Mixture of Experts, and no layer without input norms (OLMo 2's)
        assert record.c_decoder == (not record.moe and record.name not in NO_C_LAYER)
        assert registry.architecture(record.name) is record


def test_gguf_names_tell_dense_from_mixture_of_experts():
    assert registry.for_gguf("llama", moe=False).name == "llama"
    assert registry.for_gguf("llama", moe=True).name == "mixtral"
    assert registry.for_gguf("qwen3moe", moe=True).name == "qwen3_moe"
    assert registry.for_gguf("qwen3moe", moe=False) is None
    assert registry.for_hf_classes(["Unknown", "Phi3ForCausalLM"]).name == "phi3"
    assert "OlmoeForCausalLM" in registry.supported_architectures()
    with pytest.raises(Exception, match="unsupported architecture 'nope'"):
        registry.architecture("nope")


TINY = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 40, "rms_norm_eps": 1e-5,
}  # fmt: skip


def test_a_new_family_is_one_module_and_one_families_entry(monkeypatch):
    """What docs/architecture.md's recipe promises: a module with an ARCHITECTURE record and
    its name in FAMILIES; config parsing, shape checks and the model class follow."""
    module = types.ModuleType("inferd.models.toyfamily")
    module.ARCHITECTURE = Architecture(
        name="toy", model_class=LlamaForCausalLM, hf_classes=("ToyForCausalLM",),
        hf_fields=lambda r: dict(rms_norm_eps=r.number("toy_eps")),
    )  # fmt: skip
    monkeypatch.setitem(sys.modules, "inferd.models.toyfamily", module)
    monkeypatch.setattr(registry, "FAMILIES", (*registry.FAMILIES, "toyfamily"))
    registry.records.cache_clear()
    try:
        config = model_config_from_hf({**TINY, "architectures": ["ToyForCausalLM"], "toy_eps": 0.5})
        assert (config.architecture, config.rms_norm_eps) == ("toy", 0.5)
        model = registry.model_class("toy")(config, torch.float32)
        tensors = registry.architecture("toy").layer_tensors(config, 0)
        params = dict(model.named_parameters())
        assert (
            sum(t.numel() for t in params.values())
            == sum(torch.Size(s).numel() for s in tensors.values()) + 2 * 40 * 32 + 32
        )  # embedding, untied head, final norm
    finally:
        registry.records.cache_clear()


class Lazy:
    def __init__(self, tensor: torch.Tensor):
        self.tensor, self.shape = tensor, tuple(tensor.shape)

    def expert(self, e: int) -> Lazy:
        return Lazy(self.tensor[e])

    def load(self, dtype, rows=None, cols=None):
        t = self.tensor if rows is None else self.tensor[rows[0] : rows[0] + rows[1]]
        return (t if cols is None else t[:, cols[0] : cols[0] + cols[1]]).to(dtype)


def moe_config(name="qwen3_moe") -> ModelConfig:
    return ModelConfig(name, 40, 32, 64, 1, 4, 2, 8,
                       moe=MoEConfig(3, 2, 16, True))  # fmt: skip


def test_packed_experts_become_one_matrix_per_expert():
    config = moe_config()
    gate_up = torch.arange(3 * 32 * 32, dtype=torch.float32).view(3, 32, 32)
    down = torch.randn(3, 32, 16)
    pairs = dict(normalized([("model.layers.0.mlp.experts.gate_up_proj", Lazy(gate_up)),
                             ("model.layers.0.mlp.experts.down_proj", Lazy(down))],
                            registry.architecture("qwen3_moe"), config))  # fmt: skip
    assert sorted(pairs) == sorted(f"model.layers.0.mlp.experts.{e}.{k}_proj.weight"
                                   for e in range(3) for k in ("gate", "up", "down"))  # fmt: skip
    up = pairs["model.layers.0.mlp.experts.2.up_proj.weight"]
    assert up.shape == (16, 32)
    assert torch.equal(up.load(torch.float32), gate_up[2, 16:])
    # a rank asking for rows 4..8 of expert 2's up projection reads just those
    assert torch.equal(up.load(torch.float32, rows=(4, 4)), gate_up[2, 20:24])
    assert torch.equal(pairs["model.layers.0.mlp.experts.1.down_proj.weight"].load(
        torch.float32), down[1])  # fmt: skip


def test_fused_and_renamed_tensors():
    phi3 = ModelConfig("phi3", 40, 32, 64, 1, 4, 2, 8)
    qkv = torch.randn(32 + 16 + 16, 32)
    pairs = dict(normalized([("model.layers.0.self_attn.qkv_proj.weight", Lazy(qkv))],
                            registry.architecture("phi3"), phi3))  # fmt: skip
    assert list(pairs) == [f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv"]
    assert torch.equal(pairs["model.layers.0.self_attn.k_proj.weight"].load(torch.float32),
                       qkv[32:48])  # fmt: skip
    mixtral = registry.architecture("mixtral")
    shapes = normalized_shapes({"model.layers.0.block_sparse_moe.experts.1.w3.weight": (16, 32),
                                "model.layers.0.block_sparse_moe.gate.weight": (3, 32)},
                               mixtral, moe_config("mixtral"))  # fmt: skip
    assert shapes == {"model.layers.0.mlp.experts.1.up_proj.weight": (16, 32),
                      "model.layers.0.mlp.gate.weight": (3, 32)}  # fmt: skip


def test_a_shared_expert_gate_stored_1d_is_read_as_its_row():
    config = moe_config("qwen2_moe")
    gate = torch.randn(32)
    (name, weight), = normalized([("model.layers.0.mlp.shared_expert_gate.weight", Lazy(gate))],
                                 registry.architecture("qwen2_moe"), config)  # fmt: skip
    assert weight.shape == (1, 32) and torch.equal(weight.load(torch.float32), gate.view(1, 32))


def test_rows_view_offsets_block_reads():
    class Blocks(Lazy):
        def load_blocks(self, rows=None, cols=None):
            return ("blocks", rows, cols)

    view = RowsView(Blocks(torch.zeros(10, 4)), 6, 4)
    assert view.shape == (4, 4)
    assert view.load_blocks() == ("blocks", (6, 4), None)
    assert view.load_blocks((1, 2), (0, 4)) == ("blocks", (7, 2), (0, 4))
    assert RowsView(Lazy(torch.zeros(10, 4)), 6, 4).load_blocks() is None


def test_a_checkpoint_missing_an_expert_is_one_clear_error(tmp_path):
    from inferd.errors import ModelLoadError
    from inferd.loader.checkpoint_checks import check_config_matches_tensors

    config = moe_config()
    record = registry.architecture("qwen3_moe")
    shapes = {f"model.layers.0.{n}": s for n, s in record.layer_tensors(config, 0).items()}
    shapes["model.embed_tokens.weight"] = (40, 32)
    check_config_matches_tensors(config, shapes, tmp_path)
    del shapes["model.layers.0.mlp.experts.2.up_proj.weight"]
    with pytest.raises(ModelLoadError, match="no model.layers.0.mlp.experts.2.up_proj.weight"):
        check_config_matches_tensors(config, shapes, tmp_path)
    shapes["model.layers.0.mlp.experts.2.up_proj.weight"] = (15, 32)
    with pytest.raises(ModelLoadError, match=r"shape \(15, 32\), but the config describes"):
        check_config_matches_tensors(config, shapes, tmp_path)


@pytest.mark.parametrize(
    "cfg, words",
    [
        ({"architectures": ["Phi3ForCausalLM"], "partial_rotary_factor": 0.75},
         "partial_rotary_factor 0.75 is not supported"),
        ({"architectures": ["OlmoeForCausalLM"], "num_experts": 4, "num_experts_per_tok": 2,
          "clip_qkv": 8.0}, "clip_qkv is not supported"),
        ({"architectures": ["MixtralForCausalLM"], "num_local_experts": 2,
          "num_experts_per_tok": 3}, r"experts per token \(3\) must be from 1 to"),
        ({"architectures": ["Qwen3ForCausalLM"], "attention_bias": True},
         "output-projection biases are not supported"),
        ({"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 4, "num_experts_per_tok": 2,
          "moe_intermediate_size": 8, "mlp_only_layers": [5]}, "mlp_only_layers must be"),
    ],
)  # fmt: skip
def test_family_config_errors_name_the_key(cfg, words):
    from inferd.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match=words):
        model_config_from_hf({**TINY, **cfg}, source="config.json")


def test_qwen2_keeps_its_biases_whatever_attention_bias_says():
    # HF's Qwen2 reads no attention_bias key: q/k/v always have biases, o_proj never
    config = model_config_from_hf({**TINY, "architectures": ["Qwen2ForCausalLM"],
                                   "attention_bias": True})  # fmt: skip
    assert config.attention_bias
