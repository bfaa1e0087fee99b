"""Gated MLP activations: act(gate) * up over the fused [gate | up] projection output, and
gpt-oss's clamped SwiGLU."""

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


def clamped_swiglu(alpha: float, limit: float):
    """gpt-oss's experts over [gate | up]: gate clamped from above and up on both sides at
    `limit`, then (up + 1) * gate * sigmoid(alpha * gate), in HF's order of operations."""

    def forward(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))

    return forward
