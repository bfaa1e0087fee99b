"""The `cpu` attention backend: attention in C (cpu_kernels/decode_attention.c) reading float32,
bfloat16 or int8 (inferd/kv_int8.py) caches in place, with a fixed reduction order per query
row.

Once per step and KV group the backend writes down which cached keys every query row sees (a
`RowPlan`: the row's sequence, its context length, that sequence's cache blocks); every layer of
the group, and the C decoder layer (inferd/models/cpu_decoder.py), reads it. The kernel cuts a
row's keys into chunks aligned to absolute positions and combines them in a fixed order, so a
row gets the same bits alone, in any batch, in any chunk of its prompt and with any number of
threads; decode rows and prefill rows are the same computation.

`fixed_order` False keeps the torch backend's code for prefill chunks (bf16 GEMMs over each
chunk; the dense modes' default, where speed matters more than invariance: docs/performance.md)
and the C kernel for decode rows. Caches of other dtypes (fp8) always take the torch path. The
backend is checked against the torch backend (tests/unit/test_cpu_attention.py) and is what
`auto` picks on CPU when the kernels are available.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import torch

from inferd.attention.backend import AttentionBatch, GroupBatch, LayerAttentionSpec
from inferd.attention.torch_backend import (
    DecodePlan,
    TorchAttentionBackend,
    TorchAttentionMetadata,
    store_kv,
)
from inferd.kv_int8 import INT8_KV

# The cache dtypes the C kernels read, as kv_int8.h's CACHE_* formats.
CACHE_FORMATS = {torch.float32: 0, torch.bfloat16: 1, INT8_KV: 2}
C_CACHE_DTYPES = tuple(CACHE_FORMATS)
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class KeyPlan(ctypes.Structure):
    """Mirrors KeyPlan in cpu_kernels/kernels.h."""

    _fields_ = [("rows", _I), ("seqs", _I), ("seq_rows", _P), ("lens", _P), ("blocks", _P),
                ("starts", _P), ("width", _I), ("block_size", _I)]  # fmt: skip


class AttentionShape(ctypes.Structure):
    """Mirrors AttentionShape in cpu_kernels/kernels.h."""

    _fields_ = [("heads", _I), ("kv_heads", _I), ("head_dim", _I), ("window", _I),
                ("cache_format", _I), ("scale", _F), ("softcap", _F), ("sinks", _P)]  # fmt: skip


@dataclass
class RowPlan:
    """The keys every query row of a step sees in one KV group, as the C kernel reads them;
    `struct` points into the tensors, which live as long as the plan."""

    seq_rows: torch.Tensor  # [seqs + 1] int64: sequence s has rows seq_rows[s] .. [s + 1] - 1
    lens: torch.Tensor  # [rows] int64: keys up to position lens[i] - 1 (the row's own)
    blocks: torch.Tensor  # [seqs, width] int64: each sequence's blocks from position starts[s]
    starts: torch.Tensor  # [seqs] int64
    block_size: int
    struct: KeyPlan = field(init=False)

    def __post_init__(self) -> None:
        self.struct = KeyPlan(
            self.lens.shape[0], self.starts.shape[0], self.seq_rows.data_ptr(),
            self.lens.data_ptr(), self.blocks.data_ptr(), self.starts.data_ptr(),
            self.blocks.shape[1], self.block_size,
        )  # fmt: skip


def row_plan(batch: AttentionBatch, group: GroupBatch, seq_rows: torch.Tensor,
             lens: torch.Tensor) -> RowPlan:  # fmt: skip
    """Every row of the step: a sequence's blocks run from the one holding the first key its
    first row sees (0, or the start of that row's window) to the one of its newest token.
    `seq_rows`, `lens`: the step's (the same in every group). NOTE: plain Python over the
    block tables, then one tensor each: a step's tables are small, and a dozen tensor ops
    cost more than the C layer of a one-row step's attention."""
    bs, window = group.block_size, group.window
    blocks, starts = [], []
    for q_len, n, table in zip(batch.query_lens_cpu, batch.seq_lens_cpu,
                               group.block_tables.tolist(), strict=True):  # fmt: skip
        lo = 0 if window is None else max(0, n - q_len + 1 - window)
        blocks.append(table[lo // bs : (n - 1) // bs + 1])
        starts.append(lo // bs * bs)
    width = max(map(len, blocks))
    padded = [b + [0] * (width - len(b)) for b in blocks]  # padding: never read
    return RowPlan(seq_rows, lens, torch.tensor(padded, dtype=torch.int64),
                   torch.tensor(starts, dtype=torch.int64), bs)  # fmt: skip


def decode_row_plan(plan: DecodePlan) -> RowPlan:
    """A torch decode plan as a RowPlan: one row per sequence (kept in the plan's memo)."""
    if "rows" not in plan.memo:
        n = plan.lens.shape[0]
        plan.memo["rows"] = RowPlan(torch.arange(n + 1), plan.lens.long(),
                                    plan.blocks.view(n, plan.width).long(), plan.starts.long(),
                                    plan.block_size)  # fmt: skip
    return plan.memo["rows"]


def attend_in_c(lib: ctypes.CDLL, q: torch.Tensor, kv_cache: torch.Tensor, rows: RowPlan,
                spec: LayerAttentionSpec) -> torch.Tensor:  # fmt: skip
    """The rows' attention read straight from the pool (keys and values already stored)."""
    q = q.float().contiguous()
    out = torch.empty(q.shape[0], spec.num_heads, spec.head_dim)
    sinks = None if spec.sinks is None else spec.sinks.float().contiguous()  # lives past the call
    shape = AttentionShape(spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.window or 0,
                           CACHE_FORMATS[kv_cache.dtype], spec.scale,
                           spec.softcap or 0.0,
                           None if sinks is None else sinks.data_ptr())  # fmt: skip
    rc = lib.inferd_paged_attention(q.data_ptr(), kv_cache[0].data_ptr(), kv_cache[1].data_ptr(),
                                    ctypes.byref(rows.struct), ctypes.byref(shape),
                                    out.data_ptr())  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"the attention kernel failed ({rc}) for {spec}")
    return out


@dataclass
class CpuAttentionMetadata:
    """The cpu backend's plan of a step: a RowPlan per KV group, and the torch backend's plans
    for what runs in PyTorch (made on first use: a fixed-order step on float32 or bf16 caches
    never needs them)."""

    batch: AttentionBatch
    rows: list[RowPlan]
    slot_mappings: list[torch.Tensor]
    _torch: TorchAttentionMetadata | None = None

    def torch_plans(self) -> TorchAttentionMetadata:
        if self._torch is None:
            self._torch = TorchAttentionBackend().build_metadata(self.batch)
        return self._torch


class CpuAttentionBackend(TorchAttentionBackend):
    """`lib`: the loaded C kernels (`inferd.cpu_kernels.kernel_library()`); `fixed_order`: every
    row in C (see the module docstring)."""

    name = "cpu"

    def __init__(self, lib: ctypes.CDLL, fixed_order: bool = True):
        self.lib, self.fixed_order = lib, fixed_order

    def build_metadata(self, batch: AttentionBatch) -> CpuAttentionMetadata:
        seq_rows, lens = batch.query_start_loc.long(), batch.positions + 1
        rows = [row_plan(batch, g, seq_rows, lens) for g in batch.groups]
        return CpuAttentionMetadata(batch, rows, [g.slot_mapping for g in batch.groups])

    def forward(self, q, k, v, kv_cache, spec: LayerAttentionSpec,
                metadata: CpuAttentionMetadata) -> torch.Tensor:  # fmt: skip
        in_c = kv_cache.device.type == "cpu" and kv_cache.dtype in C_CACHE_DTYPES
        if not (in_c and self.fixed_order):
            return super().forward(q, k, v, kv_cache, spec, metadata.torch_plans())
        store_kv(kv_cache, metadata.slot_mappings[spec.group], k, v)
        out = attend_in_c(self.lib, q, kv_cache, metadata.rows[spec.group], spec)
        return out.to(v.dtype)

    def decode_attention(self, q: torch.Tensor, kv_cache: torch.Tensor, plan: DecodePlan,
                         spec: LayerAttentionSpec) -> torch.Tensor:  # fmt: skip
        if kv_cache.device.type != "cpu" or kv_cache.dtype not in C_CACHE_DTYPES:
            return super().decode_attention(q, kv_cache, plan, spec)
        return attend_in_c(self.lib, q, kv_cache, decode_row_plan(plan), spec)
