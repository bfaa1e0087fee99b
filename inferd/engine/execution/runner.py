"""The model runner: owns the device KV cache tensors and the device side's copy of every
running sequence (device_state.py); turns a step record into input tensors and the step's
`AttentionBatch`, has the attention backend build its metadata from it once, runs the model and
returns the logits of the positions to sample.

    execute_step(StepRecord): zero and copy blocks, apply the record's deltas, run its rows
    execute([SequenceStep]):  run rows given whole (the tests; what execute_step calls)

Only the last new token of a sequence that needs sampling goes through the LM head: on Gemma 3
270M the head is most of the per-token work, so prompt positions skip it. A speculative
verification step (`SequenceStep.verify`: the last token and its drafts) needs the logits of
every one of its tokens, and runs each token as a decode row of its own (`build_batch`).
"""

from __future__ import annotations

import torch

from inferd.attention.backend import (
    AttentionBackend,
    AttentionBatch,
    ForwardContext,
    GroupBatch,
)
from inferd.attention.torch_backend import TorchAttentionBackend
from inferd.engine.execution.device_state import DeviceSequences, SequenceStep
from inferd.engine.execution.image_encoder import EncoderCache, attach_images
from inferd.engine.execution.lora_cache import AdapterCache
from inferd.engine.execution.pooler import chunk_part
from inferd.engine.scheduling.step import BASE_MODEL, StepRecord
from inferd.kv_int8 import row_width
from inferd.lora_request import LoRARequest
from inferd.models.base import CausalLM
from inferd.profiling.step_timer import StepTimer


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        num_blocks: list[int],  # per KV group
        block_size: int,
        kv_dtype: torch.dtype,
        device: torch.device,
        backend: AttentionBackend | None = None,
        lazy_zero: bool = False,
    ):
        """`lazy_zero`: leave the KV pool uninitialised and let the caller zero each block
        before its first use (`clear_blocks`), as the engine does; otherwise zero it now."""
        self.model, self.block_size, self.device = model, block_size, device
        self.backend = backend or TorchAttentionBackend()
        self.graphs = None  # a CUDAGraphDecoder once captured (GPU)
        cfg = model.config
        self.groups = cfg.kv_groups()
        if len(num_blocks) != len(self.groups):
            raise ValueError(f"{len(self.groups)} KV groups but {len(num_blocks)} pool sizes")
        # this rank's KV heads under TP; an int8 row holds its scale after the codes, so a
        # block stays `cache[:, block]` of one tensor per layer (inferd/kv_int8.py)
        self._pool_shape = (model.local_kv_heads, row_width(cfg.head_dim, kv_dtype))
        self._num_blocks, self.kv_dtype = list(num_blocks), kv_dtype
        self.kv_caches: list[list[torch.Tensor]] = []
        self.allocate_kv_pool(lazy_zero)
        self.sequences = DeviceSequences(len(self.groups))
        self.adapter_cache = AdapterCache(1)  # parsed adapters, when LoRA is enabled
        # A vision-language model's encodings by image content hash (image_encoder.py).
        self.encoder_cache = EncoderCache(model) if cfg.vision is not None else None

    @torch.inference_mode()
    def execute_step(
        self, record: StepRecord, timer: StepTimer | None = None
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor], list[SequenceStep], dict[int, torch.Tensor]]:
        """Run a scheduled step: (logits of the rows to sample, row index → logits of every new
        token for rows asking for prompt logprobs, the rows as run, row index → what pooling
        rows contribute to their embedding: engine/execution/pooler.py `chunk_part`)."""
        self.clear_blocks(record.blocks_to_clear)  # before the copies: they may land there
        self.copy_blocks(record.block_copies)
        for load in record.kv_loads:  # blocks from a KV tier (engine/kv_tiers/): fresh ones
            self.write_blocks(load.blocks, load.rows)
        self.load_adapters(record.adapter_loads)
        self.sequences.apply(record)
        rows = self.sequences.forward_rows(record)
        if not rows:
            return self._no_logits(), {}, rows, {}
        attach_images(self.encoder_cache, record, rows, self.sequences)
        pooled: dict[int, torch.Tensor] = {}
        logits, every = self.execute_with_prompt_logits(rows, timer, pooled)
        return logits, every, rows, pooled

    def _no_logits(self) -> torch.Tensor:
        return torch.empty((0, self.model.config.vocab_size), dtype=torch.float32,
                           device=self.device)  # fmt: skip

    def kv_cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for group in self.kv_caches for t in group)

    def allocate_kv_pool(self, lazy_zero: bool = True) -> None:
        """Make the KV pool's tensors (at start, and when a sleep ends). `lazy_zero`: leave
        them uninitialised (on CPU untouched pages cost no memory until a block is used; the
        engine zeroes each block on its first use); otherwise zero them now."""
        alloc = torch.empty if lazy_zero else torch.zeros
        self.kv_caches = [
            [alloc(2, n, self.block_size, *self._pool_shape, dtype=self.kv_dtype,
                   device=self.device) for _ in layers]
            for n, (_, layers) in zip(self._num_blocks, self.groups)
        ]  # fmt: skip
        self.clear_blocks([[0]] * len(self.groups))  # the null block pads gathers: keep it 0

    def free_kv_pool(self) -> int:
        """Drop the KV pool's tensors (a sleep: engine/core/sleep_mode.py); returns their bytes.
        NOTE: only while no sequence runs: the device side keeps no block's contents."""
        freed = self.kv_cache_bytes()
        self.kv_caches = [[] for _ in self.groups]
        return freed

    def build_batch(self, steps: list[SequenceStep]) -> tuple[torch.Tensor, AttentionBatch]:
        """(input ids, the step's layout) of the scheduled sequences.

        A verification step's tokens enter the layout as one-token sequences sharing the
        block table, token j seeing the context up to itself: causal attention over the same
        keys, as the chunk it also is. NOTE: that is what makes a verification step as cheap
        as a decode step of that many rows: decode attention reads the cache in place and the
        C decoder layer (models/cpu_decoder.py) serves pure decode steps only. Attention
        stores every new key before any query attends, so row j finds rows < j in the cache.
        """
        steps = [row for s in steps for row in _decode_rows(s)]
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        query_lens, seq_lens = [], []
        slot_maps: list[list[int]] = [[] for _ in self.groups]
        for s in steps:
            n_new = len(s.token_ids)
            ids.extend(s.token_ids)
            pos = range(s.num_computed, s.num_computed + n_new)
            positions.extend(pos)
            query_lens.append(n_new)
            seq_lens.append(s.num_computed + n_new)
            for g, table in enumerate(s.block_tables):
                slot_maps[g].extend(table[p // bs] * bs + p % bs for p in pos)
        dev = self.device
        qsl = [0]
        for n in query_lens:
            qsl.append(qsl[-1] + n)
        groups = []
        for g, (window, _) in enumerate(self.groups):
            width = max(len(s.block_tables[g]) for s in steps)
            tables = [s.block_tables[g] + [0] * (width - len(s.block_tables[g])) for s in steps]
            groups.append(
                GroupBatch(
                    slot_mapping=torch.tensor(slot_maps[g], dtype=torch.int64, device=dev),
                    block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
                    block_size=bs,
                    window=window,
                )
            )
        batch = AttentionBatch(
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            groups=groups,
            query_lens_cpu=query_lens,
            seq_lens_cpu=seq_lens,
        )
        return torch.tensor(ids, dtype=torch.int64, device=dev), batch

    @torch.inference_mode()
    def execute(self, steps: list[SequenceStep]) -> torch.Tensor:
        """Run one step; returns float32 logits [number of steps with needs_logits, vocab]."""
        return self.execute_with_prompt_logits(steps)[0]

    @torch.inference_mode()
    def execute_with_prompt_logits(
        self,
        steps: list[SequenceStep],
        timer: StepTimer | None = None,
        pooled: dict[int, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Also returns, for steps with `all_logits`, the logits of all their new tokens.
        `timer` (the engine's StepTimer) learns where the forward begins; `pooled` receives,
        per index of a step with `pooling`, its part of the final hidden states."""
        if (
            self.graphs is not None
            and self.graphs.can_run(steps)
            and not any(s.embeds for s in steps)
        ):
            if timer is not None:
                timer.begin("forward")  # the graph copies its inputs itself
            return self.graphs.run(steps), {}
        input_ids, batch = self.build_batch(steps)
        ctx = ForwardContext.for_step(batch, self.kv_caches, self.backend)
        if timer is not None:
            timer.begin("forward")
        self._prepare_adapters(steps)
        index, rows = _embeds_of(steps)
        if index:  # image features at their placeholder tokens (SequenceStep.embeds)
            embeds = (torch.tensor(index, dtype=torch.int64, device=self.device),
                      torch.cat(rows).to(self.device))  # fmt: skip
            hidden = self.model(input_ids, batch.positions, ctx, embeds)
        else:
            hidden = self.model(input_ids, batch.positions, ctx)
        last, offset, every = [], 0, {}
        for i, s in enumerate(steps):
            if s.all_logits:
                every[i] = self.model.compute_logits(hidden[offset : offset + len(s.token_ids)])
            if s.pooling is not None and pooled is not None:
                part = chunk_part(hidden[offset : offset + len(s.token_ids)], s.pooling,
                                  s.num_computed)  # fmt: skip
                if part is not None:
                    pooled[i] = part
            offset += len(s.token_ids)
            last.extend(range(offset - s.num_logits, offset))
        if not last:
            return hidden.new_empty((0, self.model.config.vocab_size), dtype=torch.float32), every
        if len(last) == hidden.shape[0]:  # every row, in order (a decode step): no gather
            return self.model.compute_logits(hidden), every
        index = torch.tensor(last, dtype=torch.int64, device=hidden.device)
        return self.model.compute_logits(hidden.index_select(0, index)), every

    def _prepare_adapters(self, steps: list[SequenceStep]) -> None:
        """Tell the model's LoRA slots which adapter each token of the step runs under; a
        model without slots refuses any row asking for one."""
        lora = getattr(self.model, "lora", None)
        if lora is not None:
            lora.prepare([s.adapter_slot for s in _flat(steps) for _ in s.token_ids])
        elif any(s.adapter_slot != BASE_MODEL for s in steps):
            slot = next(s.adapter_slot for s in steps if s.adapter_slot != BASE_MODEL)
            raise ValueError(f"a row asks for adapter slot {slot}, but LoRA is not enabled")

    def load_adapters(self, loads: list[tuple[int, LoRARequest]]) -> None:
        """Put adapters into their slots (the step record's `adapter_loads`), before the step."""
        for slot, request in loads:
            lora = self.model.lora
            adapter = self.adapter_cache.get(request, lora)
            lora.load(slot, request.lora_int_id, adapter.weights, adapter.config.scale)

    def block_tensors(self, group: int) -> list[torch.Tensor]:
        """Every tensor holding KV group `group`'s blocks, block index on dim 1: what a block
        is made of, for zeroing, copying and the KV connector (engine/kv_tiers/)."""
        return self.kv_caches[group]

    def kv_layout(self) -> str:
        """What a block's bytes (`read_blocks`) are made of: dtype and shape of every tensor
        of every group. Equal layouts read and write the same bytes."""
        tensors = [t for g in range(len(self.groups)) for t in self.block_tensors(g)]
        shapes = ";".join(f"{t.dtype}{list(t.shape[2:])}" for t in tensors)
        return f"{shapes}|block_size={self.block_size}"

    def block_bytes(self) -> int:
        """Bytes of one block of every group (a row of `read_blocks`)."""
        return sum(t[:, 0].numel() * t.element_size() for g in range(len(self.groups))
                   for t in self.block_tensors(g))  # fmt: skip

    def read_blocks(self, blocks: list[list[int]]) -> torch.Tensor:
        """Copies of blocks, on the host: `blocks[g][j]` is block j's id in group g; row j of
        the [len(blocks[0]), block_bytes()] uint8 result holds its every group and tensor."""
        parts = []
        for group, ids in enumerate(blocks):
            index = torch.tensor(ids, device=self.device)
            for cache in self.block_tensors(group):
                picked = cache.index_select(1, index).transpose(0, 1).contiguous()
                parts.append(picked.view(torch.uint8).reshape(len(ids), -1).cpu())
        return torch.cat(parts, dim=1)

    def write_blocks(self, blocks: list[list[int]], rows: torch.Tensor) -> None:
        """The inverse of `read_blocks`: row j goes into blocks[g][j] of each group g; a
        NULL block (0: the group does not need that block) skips that part."""
        offset = 0
        for group, ids in enumerate(blocks):
            keep = [j for j, b in enumerate(ids) if b != 0]
            index = torch.tensor([ids[j] for j in keep], device=self.device)
            rows_kept = rows[keep] if len(keep) < len(ids) else rows
            for cache in self.block_tensors(group):
                one = cache[:, 0]
                size = one.numel() * one.element_size()
                if keep:
                    part = rows_kept[:, offset : offset + size].contiguous().to(self.device)
                    part = part.view(cache.dtype).reshape(len(keep), *one.shape)
                    target = cache.view(torch.uint8) if cache.element_size() == 1 else cache
                    source = part.view(torch.uint8) if cache.element_size() == 1 else part
                    target.index_copy_(1, index, source.transpose(0, 1))
                offset += size

    def clear_blocks(self, blocks: list[list[int]]) -> None:
        """Zero blocks (per group) before their first use: the torch backend reads whole blocks,
        including slots not written yet, and masks them; uninitialised memory could be NaN."""
        for group, ids in enumerate(blocks):
            if ids:
                index = torch.tensor(ids, device=self.device)
                for cache in self.block_tensors(group):
                    # fp8 has no index_fill on CPU: its caches go through a byte view (0 is 0 in
                    # bytes; for int8 rows, codes 0 and scale 0.0). Others fill in their own
                    # dtype: byte-wise filling is far slower.
                    target = cache.view(torch.uint8) if cache.element_size() == 1 else cache
                    target.index_fill_(1, index, 0)

    def copy_blocks(self, copies: list[tuple[int, int, int]]) -> None:
        """Copy whole KV blocks (group, src, dst) in every layer of the group (fork)."""
        for group, src, dst in copies:
            for cache in self.block_tensors(group):
                cache[:, dst].copy_(cache[:, src])


def _embeds_of(steps: list[SequenceStep]) -> tuple[list[int], list[torch.Tensor]]:
    """(indices among the step's flattened tokens, row blocks in that order) of every
    SequenceStep.embeds. NOTE: rows with embeds are prefill chunks, never verification rows,
    so their tokens sit in the flattened batch as given."""
    index: list[int] = []
    rows: list[torch.Tensor] = []
    offset = 0
    for s in steps:
        for start, block in s.embeds:
            index.extend(range(offset + start, offset + start + block.shape[0]))
            rows.append(block)
        offset += len(s.token_ids)
    return index, rows


def _flat(steps: list[SequenceStep]) -> list[SequenceStep]:
    return [row for s in steps for row in _decode_rows(s)]


def _decode_rows(s: SequenceStep) -> list[SequenceStep]:
    """A verification step as one-token steps (see `build_batch`); any other step as is."""
    if not s.verify or len(s.token_ids) == 1:
        return [s]
    return [
        SequenceStep(
            [t], s.num_computed + j, s.block_tables, s.needs_logits, adapter_slot=s.adapter_slot
        )  # fmt: skip
        for j, t in enumerate(s.token_ids)
    ]
