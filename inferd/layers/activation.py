"""Gated MLP activations: act(gate) * up over the fused [gate | up] projection output."""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


def gated(act: str):
    fn = ACTIVATIONS[act]

    def forward(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return fn(gate) * up

    return forward
