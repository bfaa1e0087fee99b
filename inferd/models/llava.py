"""LLaVA (HF `LlavaForConditionalGeneration`): a CLIP vision tower, a two-layer MLP projector
from its features to the text model's embedding width, and a text model that computes as Llama
does (Llama, Mistral, Qwen2: `_TEXT_FAMILIES`). Every projected
feature row replaces one `<image>` placeholder token of the prompt (the engine puts them there:
`CausalLM.forward`'s `embeds`); the text model then computes as plain Llama.

The checkpoint nests the text model's config under `text_config` and the tower's under
`vision_config`; its tensors come in two spellings (transformers 4's `language_model.model.*`,
`vision_tower.vision_model.*`; transformers 5's `model.language_model.*`,
`model.vision_tower.*`), both mapped onto inferd's names by the record's `renames`.
"""

from __future__ import annotations

import torch
from torch import nn

from inferd.config import ModelConfig, VisionConfig
from inferd.distributed.state import SINGLE, TPGroup
from inferd.errors import ModelLoadError
from inferd.layers.weight_scheme import WeightScheme, as_scheme
from inferd.models.architecture import Architecture
from inferd.models.llama import ARCHITECTURE as LLAMA
from inferd.models.llama import LlamaForCausalLM
from inferd.models.mistral import ARCHITECTURE as MISTRAL
from inferd.models.qwen2 import ARCHITECTURE as QWEN2
from inferd.models.vision_encoder import VisionEncoder, activation
from inferd.models.vision_language import VisionLanguageModel

# The text models a LLaVA checkpoint may hold that compute as Llama does, by their config's
# `model_type`: each family's record reads its own fields (Mistral's window, Qwen2's biases).
_TEXT_FAMILIES = {"llama": LLAMA, "mistral": MISTRAL, "qwen2": QWEN2}


class LlavaProjector(nn.Module):
    """HF's `multi_modal_projector`: linear, activation, linear."""

    def __init__(self, vision: VisionConfig, text_hidden: int):
        super().__init__()
        bias = vision.projector_bias
        self.linear_1 = nn.Linear(vision.hidden_size, text_hidden, bias=bias)
        self.linear_2 = nn.Linear(text_hidden, text_hidden, bias=bias)
        self.act = activation(vision.projector_act)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(features)))


class LlavaForCausalLM(VisionLanguageModel, LlamaForCausalLM):
    def __init__(self, config: ModelConfig, scheme: WeightScheme | torch.dtype = torch.float32,
                 tp: TPGroup = SINGLE):  # fmt: skip
        super().__init__(config, scheme, tp)
        assert config.vision is not None
        # The tower in the dense dtype of the scheme (float32 or bf16: a block scheme's
        # activations dtype); its few matrices are not quantised.
        self.vision_dtype = as_scheme(scheme).dtype
        self.vision_tower = VisionEncoder(config.vision).to(self.vision_dtype)
        self.multi_modal_projector = LlavaProjector(config.vision, config.hidden_size).to(
            self.vision_dtype
        )


def vision_config(r, projector: str = "llava") -> VisionConfig:
    """config.json's `vision_config` (a CLIP tower) and the top-level LLaVA keys."""
    # (the loader's ConfigReader, over the nested object: models do not import the loader)
    v = type(r)(r.cfg.get("vision_config") or {}, f"{r.source}: vision_config")
    kind = {"clip_vision_model": "clip", "siglip_vision_model": "siglip"}.get(
        v.str("model_type", "clip_vision_model")
    )
    if kind is None:
        raise v.fail("model_type", "clip_vision_model or siglip_vision_model",
                     v.cfg.get("model_type"))  # fmt: skip
    layer = r.cfg.get("vision_feature_layer", -2)
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise r.fail("vision_feature_layer", "one layer index (lists are not supported yet)", layer)
    select = r.str("vision_feature_select_strategy", "default")
    if select not in ("default", "full"):
        raise r.fail("vision_feature_select_strategy", "default or full", select)
    image_size, patch = v.int("image_size", 224), v.int("patch_size", 32)
    if image_size % patch:
        raise v.fail("image_size", f"a multiple of patch_size {patch}", image_size)
    patches = (image_size // patch) ** 2
    token = r.cfg.get("image_token_id", r.cfg.get("image_token_index"))
    if isinstance(token, bool) or not isinstance(token, int) or token < 0:
        raise r.fail("image_token_index", "a token id", token)
    return VisionConfig(
        kind=kind,
        hidden_size=v.int("hidden_size", 768),
        intermediate_size=v.int("intermediate_size", 3072),
        num_layers=v.int("num_hidden_layers", 12),
        num_heads=v.int("num_attention_heads", 12),
        image_size=image_size,
        patch_size=patch,
        num_channels=v.int("num_channels", 3),
        layer_norm_eps=v.number("layer_norm_eps", 1e-5),
        hidden_act=v.str("hidden_act", "quick_gelu"),
        image_token_id=token,
        tokens_per_image=patches + (kind == "clip" and select == "full"),
        feature_layer=layer,
        feature_select=select,
        projector=projector,
        projector_act=r.str("projector_hidden_act", "gelu"),
        projector_bias=r.bool("multimodal_projector_bias", True),
    )


def _hf_fields(r) -> dict:
    text = r.cfg.get("text_config") or {}
    family = _TEXT_FAMILIES.get(text.get("model_type", "llama"))
    if family is None:
        known = ", ".join(_TEXT_FAMILIES)
        raise ModelLoadError(f"{r.source}: LLaVA with a {text.get('model_type')!r} text model "
                             f"is not supported yet (inferd reads: {known})")  # fmt: skip
    fields = family.hf_fields(type(r)(text, f"{r.source}: text_config"))
    return {**fields, "vision": vision_config(r)}


def _vision_tensors(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the tower and projector the model loads, with its shape."""
    v = config.vision
    assert v is not None
    d, inner, clip = v.hidden_size, v.intermediate_size, v.kind == "clip"
    out: dict[str, tuple[int, ...]] = {
        "vision_tower.embeddings.patch_embedding.weight": (d, v.num_channels, v.patch_size,
                                                           v.patch_size),
        "vision_tower.embeddings.position_embedding.weight": (v.num_patches + clip, d),
    }  # fmt: skip
    if clip:
        out["vision_tower.embeddings.class_embedding"] = (d,)
        out.update({f"vision_tower.pre_layrnorm.{p}": (d,) for p in ("weight", "bias")})
    else:
        out["vision_tower.embeddings.patch_embedding.bias"] = (d,)
    shapes = {f"self_attn.{p}_proj": (d, d) for p in ("q", "k", "v", "out")}
    shapes.update({"mlp.fc1": (inner, d), "mlp.fc2": (d, inner)})
    from inferd.models.vision_encoder import feature_depth

    for i in range(feature_depth(v)):
        at = f"vision_tower.encoder.layers.{i}."
        for name, shape in shapes.items():
            out[f"{at}{name}.weight"], out[f"{at}{name}.bias"] = shape, shape[:1]
        for norm in ("layer_norm1", "layer_norm2"):
            out.update({f"{at}{norm}.weight": (d,), f"{at}{norm}.bias": (d,)})
    if v.post_norm:
        out.update({f"vision_tower.post_layernorm.{p}": (d,) for p in ("weight", "bias")})
    return out


def _llava_tensors(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    v, h = config.vision, config.hidden_size
    assert v is not None
    out = _vision_tensors(config)
    out.update({"multi_modal_projector.linear_1.weight": (h, v.hidden_size),
                "multi_modal_projector.linear_2.weight": (h, h)})  # fmt: skip
    if v.projector_bias:
        out.update({"multi_modal_projector.linear_1.bias": (h,),
                    "multi_modal_projector.linear_2.bias": (h,)})  # fmt: skip
    return out


ARCHITECTURE = Architecture(
    name="llava",
    model_class=LlavaForCausalLM,
    hf_classes=("LlavaForConditionalGeneration",),
    hf_text_config="text_config",
    hf_fields=_hf_fields,
    # transformers 5's spelling first, then transformers 4's (HF hub checkpoints)
    renames=(
        ("model.language_model.", "model."),
        ("language_model.model.", "model."),
        ("language_model.lm_head.", "lm_head."),
        ("model.vision_tower.", "vision_tower."),
        ("vision_tower.vision_model.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
    ),
    model_tensors=_llava_tensors,
    tensor_parallel=False,
)
