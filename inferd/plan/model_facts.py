"""The model a plan is for: a GGUF file, an HF folder, a catalog name (what `inferd memory`
opens), or an architecture and a parameter count (`--arch llama --params 70B`), which takes the
shape of the published model of that family nearest in size (SHAPES).

What the step model needs of it: the config (layers, hidden size, heads, vocabulary, windows),
the stored checkpoint's weights by GGUF type where there is a file (the default mode on a CPU
multiplies by those blocks, at each format's own rate), and the parameter counts of
inferd.memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from inferd.config import ModelConfig
from inferd.memory.weights import CheckpointWeights, count_parameters

# Published shapes (each model's config.json on its hub page): family → [(label, fields)].
# "--params 7B" takes the entry of the family nearest in parameters.
SHAPES: dict[str, list[tuple[str, dict]]] = {
    "llama": [
        ("Llama 2 7B", dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                            num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                            max_position_embeddings=4096)),
        ("Llama 3.1 8B", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                              num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                              max_position_embeddings=131072)),
        ("Llama 2 13B", dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                             num_attention_heads=40, num_key_value_heads=40, vocab_size=32000,
                             max_position_embeddings=4096)),
        ("Llama 3.1 70B", dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                               num_attention_heads=64, num_key_value_heads=8, vocab_size=128256,
                               max_position_embeddings=131072)),
        ("Llama 3.1 405B", dict(hidden_size=16384, intermediate_size=53248,
                                num_hidden_layers=126, num_attention_heads=128,
                                num_key_value_heads=8, vocab_size=128256,
                                max_position_embeddings=131072)),
    ],
    "qwen2": [
        ("Qwen2.5 0.5B", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                              num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                              max_position_embeddings=32768, tie_word_embeddings=True)),
        ("Qwen2.5 1.5B", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                              num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                              max_position_embeddings=32768, tie_word_embeddings=True)),
        ("Qwen2.5 7B", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                            num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                            max_position_embeddings=32768)),
        ("Qwen2.5 32B", dict(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
                             num_attention_heads=40, num_key_value_heads=8, vocab_size=152064,
                             max_position_embeddings=32768)),
        ("Qwen2.5 72B", dict(hidden_size=8192, intermediate_size=29568, num_hidden_layers=80,
                             num_attention_heads=64, num_key_value_heads=8, vocab_size=152064,
                             max_position_embeddings=32768)),
    ],
    "mistral": [
        ("Mistral 7B v0.3", dict(hidden_size=4096, intermediate_size=14336,
                                 num_hidden_layers=32, num_attention_heads=32,
                                 num_key_value_heads=8, vocab_size=32768,
                                 max_position_embeddings=32768)),
    ],
}  # fmt: skip
HF_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
              "mistral": "MistralForCausalLM"}  # fmt: skip
SIZE_TOLERANCE = 0.35  # --params more than this far from every shape of the family: refused


@dataclass(frozen=True)
class ModelFacts:
    name: str
    config: ModelConfig
    source: str  # the path, catalog name, or "shape of Llama 3.1 70B"
    checkpoint: CheckpointWeights | None = None  # None: a config only
    format: str = "config"  # "gguf", "hf" or "config"
    # A GGUF file's matrices by type: the decoder layers' ("q5_0": params, ...) and the LM
    # head's type (the embedding's where tied); empty / "" for other checkpoints
    layer_formats: dict[str, int] = field(default_factory=dict)
    head_format: str = ""

    @property
    def params(self) -> int:
        return count_parameters(self.config).total

    def block_formats(self) -> dict[str, int]:
        """A GGUF file's parameters by its types ("q4_k": count, "f32": count, ...)."""
        if self.checkpoint is None or self.checkpoint.format != "gguf":
            return {}
        return {t.lower(): params for t, (params, _) in self.checkpoint.by_type.items()}


def parse_params(text: str) -> int:
    """'7B' → 7e9, '270M' → 2.7e8, '1.5b', '7000000000'."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMbBtT]?)\s*", text)
    if not m:
        raise ValueError(f"--params {text!r}: a count like 7B, 1.5B, 270M or 7000000000")
    scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def shape_for(arch: str, params: int) -> tuple[str, ModelConfig]:
    """The published shape of `arch` nearest `params`; a ValueError names the known ones."""
    from inferd.loader.hf_config import model_config_from_hf

    family = arch.lower()
    if family not in SHAPES:
        raise ValueError(f"--arch {arch!r}: known families {', '.join(SHAPES)}")
    best = None
    for label, fields in SHAPES[family]:
        config = model_config_from_hf(
            {"architectures": [HF_CLASSES[family]], "torch_dtype": "bfloat16", **fields},
            name=label,
        )
        count = count_parameters(config).total
        error = abs(count - params) / params
        if best is None or error < best[0]:
            best = (error, label, config)
    assert best is not None
    if best[0] > SIZE_TOLERANCE:
        sizes = ", ".join(label for label, _ in SHAPES[family])
        raise ValueError(f"--params {params / 1e9:g}B: no {family} shape near it (known: {sizes})")
    return best[1], best[2]


def load_model(model: str | None, arch: str | None = None, params: str | None = None) -> ModelFacts:
    """The model from a path or name (None: the embedded model), or from --arch and --params."""
    if arch or params:
        if model:
            raise ValueError("give a model (file, folder, name) or --arch and --params, not both")
        if not (arch and params):
            raise ValueError("--arch and --params go together (e.g. --arch llama --params 70B)")
        label, config = shape_for(arch, parse_params(params))
        return ModelFacts(label, config, f"the shape of {label} (--arch {arch} --params {params})")
    from inferd.loader.checkpoint import open_checkpoint
    from inferd.memory.weights import checkpoint_weights

    checkpoint = open_checkpoint(model)
    layers: dict[str, int] = {}
    head = ""
    if checkpoint.gguf is not None:
        from inferd.loader.gguf_quants import TYPE_NAMES

        tensors = checkpoint.gguf.tensors
        for name, info in tensors.items():
            kind = TYPE_NAMES.get(info.ggml_type, str(info.ggml_type)).lower()
            if name.startswith("blk.") and len(info.shape) == 2:
                layers[kind] = layers.get(kind, 0) + int(info.shape[0]) * int(info.shape[1])
        head_info = tensors.get("output.weight") or tensors.get("token_embd.weight")
        if head_info is not None:
            head = TYPE_NAMES.get(head_info.ggml_type, str(head_info.ggml_type)).lower()
    return ModelFacts(
        checkpoint.display_name,
        checkpoint.config,
        str(checkpoint.path),
        checkpoint_weights(checkpoint),
        checkpoint.format,
        layers,
        head,
    )
