"""A tensor held in memory, handed to inferd's loader code as a checkpoint tensor is (the lazy
weight contract of inferd/loader/hf_dir.py: `shape`, `load(dtype, rows=, cols=)`, `expert`)."""

from __future__ import annotations

import torch


class InMemoryWeight:
    def __init__(self, t: torch.Tensor):
        self.t, self.shape = t, tuple(t.shape)

    def expert(self, index: int) -> InMemoryWeight:
        return InMemoryWeight(self.t[index])

    def load(self, dtype, rows=None, cols=None):
        t = self.t
        if rows is not None:
            t = t[rows[0] : rows[0] + rows[1]]
        if cols is not None:
            t = t[:, cols[0] : cols[0] + cols[1]]
        return t.to(dtype)
