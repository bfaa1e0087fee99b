"""Request and sequence state, as the engine core keeps it: token ids, KV blocks, progress.

A `Request` is what a user submitted: one prompt, one `SamplingParams`, `n` samples. Each sample
is a `Sequence`, the unit the scheduler and the KV cache work with. With n > 1 the request runs
as a single sequence until its prompt is computed; then the sequence forks, the children sharing
the prompt's KV blocks, so the prompt is computed once. The children exist from the start (in
`Request.forks`) but only the scheduler starts them.

This is the one place that owns a request's per-request state in the core: a per-row feature
keeps its state here as a typed field (a grammar's compilation and matchers, `grammar` and
`Sequence.matcher`), the scheduler turns it into the step record's per-row fields
(engine/scheduling/step.py), and nothing else needs to be handed the feature. Text (detokenizing,
stop strings, logprob token strings) is the front end's (engine/frontend/output_processor.py); the
core sees token ids only.

Only the scheduler (`scheduler.py`) changes a sequence's status and counters.

A sequence's progress is two numbers: `num_tokens` (prompt + generated) and `num_computed`
(tokens whose keys/values are in the KV cache). The scheduler only ever hands out
`num_tokens - num_computed` more tokens; prefill, chunked prefill, decode and recompute after
preemption are all that one rule.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inferd.block_hashes import block_hash, image_keys, prompt_root
from inferd.lora_request import LoRARequest

if TYPE_CHECKING:
    from inferd.outputs import RequestMetrics
    from inferd.pooling_params import PoolingParams
    from inferd.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    seq_id: int
    request: Request
    sample_index: int  # which of the request's n samples
    token_ids: list[int]  # prompt followed by generated tokens
    num_prompt_tokens: int
    num_computed: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    block_tables: list[list[int]] = field(default_factory=list)  # one per KV group
    block_hashes: list[bytes] = field(default_factory=list)  # chained hashes of full blocks
    registered_blocks: int = 0  # leading full blocks already entered in the prefix cache
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # Structured outputs: this sample's grammar state (a GrammarMatcher), None when free.
    matcher: Any = None
    # What the device side knows of this sequence (the step record sends only what changed):
    # whether it has been sent, how many of its tokens, and its block tables as last sent.
    sent: bool = False
    num_sent_tokens: int = 0
    sent_tables: list[list[int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def prefill_done(self) -> bool:
        return self.num_computed >= self.num_prompt_tokens


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    metrics: RequestMetrics  # the core's timestamps; the front end's copy adds what it sees
    max_tokens: int  # resolved: params.max_tokens or what the context leaves
    sequences: list[Sequence] = field(default_factory=list)  # the samples that have started
    forks: list[Sequence] = field(default_factory=list)  # samples 1..n-1, until the prompt is done
    forked: bool = False  # every sample has started (prompt done), or n == 1
    error: str | None = None
    # A tenant's secret mixed into its prefix-cache hashes (vLLM's `cache_salt`): requests with
    # different salts never share cached blocks, so one cannot time another's prompts.
    cache_salt: str | None = None
    # Structured outputs: the grammar's compilation (a GrammarCompilation, engine/
    # structured_outputs.py), which gives every sample its matcher; None when the reply is free.
    grammar: Any = None
    sent_events: tuple | None = None  # the RequestEvents the front end last heard, as a tuple
    # An embedding request (resolved PoolingParams): its prompt is computed, then pooled into
    # one vector (engine/execution/pooler.py); nothing is sampled. `params` are then
    # SamplingParams()'s defaults, which the scheduler reads (n = 1, no logprobs) and nothing else
    # does.
    pooling: PoolingParams | None = None
    embedding: list[float] | None = None  # once the pooling finished
    # LoRA: the adapter it runs under (None: the base model) and, once the scheduler gave it
    # one, the slot holding that adapter (held until the request finishes).
    lora: LoRARequest | None = None
    adapter_slot: int = 0
    # vLLM's `priority`: under the priority scheduling policy a lower value is admitted first
    # and may preempt a running request of a higher value (engine/scheduling/waiting_queue.py);
    # 0 under fcfs, where the front end refuses any other value.
    priority: int = 0
    # The background lane (a batch's line, server/batches/): its prompt is prefilled only in
    # the room interactive requests leave, a few tokens a step (engine/scheduling/
    # background_lane.py); its tokens are those it gets alone.
    background: bool = False
    # The prompt's images (ImageInput records, inferd/multimodal/image_input.py): their
    # placeholders' blocks are named with their content hashes (`update_block_hashes`).
    images: list = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.forked and all(s.is_finished for s in self.sequences)

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.params.prompt_logprobs is not None

    @property
    def needs_every_position(self) -> bool:
        """Every prompt position must be computed, none served from the prefix cache: prompt
        logprobs need their logits, mean and cls pooling their hidden states."""
        pooling = self.pooling is not None and self.pooling.pooling_type != "last"
        return pooling or self.wants_prompt_logprobs

    def seed_of(self, seq: Sequence) -> int | None:
        """Sample i of a seeded request uses seed + i: reproducible, and distinct samples."""
        seed = self.params.seed
        return None if seed is None else seed + seq.sample_index


def update_block_hashes(seq: Sequence, block_size: int, root: bytes) -> None:
    """Extend `seq.block_hashes` to cover every full block of its known tokens."""
    full = seq.num_tokens // block_size
    while len(seq.block_hashes) < full:
        i = len(seq.block_hashes)
        if seq.block_hashes:
            parent = seq.block_hashes[-1]
        else:
            # NOTE: the adapter is part of the root: no block is shared across adapters.
            parent = prompt_root(root, seq.request.cache_salt, seq.request.lora)
        start, end = i * block_size, (i + 1) * block_size
        extra = image_keys(seq.request.images, start, end) if seq.request.images else b""
        seq.block_hashes.append(block_hash(parent, seq.token_ids[start:end], extra))


def check_token_stops(seq: Sequence, token: int, eos_ids: tuple[int, ...],
                      max_model_len: int) -> None:  # fmt: skip
    """After appending `token`: whether it ends the sequence, by the token stops in their order:
    EOS (unless ignore_eos), a stop_token_ids entry, max_tokens, the context. EOS and stop tokens
    count only past min_tokens (the sampler held them back until then). Stop strings are the
    front end's (engine/frontend/output_processor.py)."""
    params = seq.request.params
    n_out = seq.num_output_tokens
    can_stop = n_out > params.min_tokens
    if can_stop and not params.ignore_eos and token in eos_ids:
        seq.finish_reason, seq.stop_reason = "stop", None
    elif can_stop and params.stop_token_ids and token in params.stop_token_ids:
        seq.finish_reason, seq.stop_reason = "stop", token
    elif n_out >= seq.request.max_tokens or seq.num_tokens >= max_model_len:
        seq.finish_reason = "length"
