"""What the weights take in memory in the mode the engine will run, not only parameters × bytes.

Forced dtypes and quantisations hold every weight densely (`weights.weight_bytes`). The default
mode on a CPU where inferd's C kernels run keeps a GGUF file's own blocks instead
(inferd/layers/weight_scheme.py, docs/performance.md): about the file's size, each quantised
type in the layout of inferd/layers/gguf_blocks.py (gguf_quants.PACKED_BITS), and nothing
more at any step size (every step multiplies by the blocks). Tensors the file does not
quantise (norms, an F16 file's matrices) are held densely in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferd.loader.gguf_cache import UNPACKING_BYTES
from inferd.loader.gguf_quants import PACKED_BITS
from inferd.memory.weights import CheckpointWeights, weight_bytes

DENSE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class WeightPlan:
    """The weights' bytes in one mode."""

    scheme: str  # gguf (the blocks), or the dense precision (fp32, bf16, int8, ...)
    compute_dtype: str  # the GEMMs' and activations' precision: fp32 or bf16
    held: int  # after load, and at every step after it
    note: str = ""
    # a first load's transient beyond `held`: the blocks of one range of rows unpacked at a time
    # (inferd/layers/gguf_blocks.py `packed`), before they are packed and written out
    unpacking: int = 0
    stored: bool = False  # an HF checkpoint's pre-quantised weights, repacked as blocks

    @property
    def total(self) -> int:
        return self.held

    @property
    def blocks(self) -> bool:
        return self.scheme == "gguf" or self.stored


def dense_plan(num_params: int, precision: str) -> WeightPlan:
    compute = precision if precision in DENSE_BYTES else "bf16"
    return WeightPlan(precision, compute, weight_bytes(num_params, precision))


def keeps_blocks(dtype: str, device: str, checkpoint: CheckpointWeights | None,
                 tensor_parallel: int, block_kernels: bool) -> bool:  # fmt: skip
    """Whether the engine's default keeps the GGUF blocks here (the conditions of
    `choose_scheme` in inferd/layers/weight_scheme.py: --dtype auto, no --quantization, a CPU,
    a GGUF file, no tensor parallelism, inferd's C kernels)."""
    return (dtype == "auto" and device == "cpu" and checkpoint is not None
            and checkpoint.format == "gguf" and tensor_parallel == 1
            and block_kernels)  # fmt: skip


def block_plan(checkpoint: CheckpointWeights) -> WeightPlan:
    """The default mode's weights on a GGUF file: the blocks, and float32 for the rest."""
    held = 0
    for type_name, (params, _) in checkpoint.by_type.items():
        if type_name in PACKED_BITS:
            held += round(params * PACKED_BITS[type_name] / 8)
        else:
            held += params * DENSE_BYTES["fp32"]
    return WeightPlan("gguf", "fp32", held, "the file's blocks, at every step size",
                      unpacking=UNPACKING_BYTES)  # fmt: skip


def stored_plan(checkpoint: CheckpointWeights) -> WeightPlan:
    """A pre-quantised HF checkpoint (AWQ, GPTQ, compressed-tensors, MXFP4): its weights kept
    as stored, repacked for the C kernels; its other tensors float32."""
    fmt = checkpoint.quant
    return WeightPlan(
        fmt.method,
        "fp32",
        checkpoint.quant_held,
        f"the checkpoint's {fmt.describe()}; {fmt.held_bits_per_weight():.2f} bits per weight held",
        unpacking=UNPACKING_BYTES,
        stored=True,
    )
