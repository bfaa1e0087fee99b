"""The step record: what one engine step is made of, as plain data.

    Scheduler.schedule() ──StepRecord──▶ Executor.execute() ──ModelRunnerOutput──▶
    Scheduler.update_from_output() ──▶ one CoreOutput per request with news (engine/outputs.py)

`StepRecord` is everything the device side needs for a step; the runner, the tensor-parallel
workers and the CUDA-graph runner all read it. It holds no object of the scheduler's (no request,
no sequence), only ids, numbers and lists, so it crosses a process boundary as it is
(`test_step_record.py` round-trips it through the wire format). It is a delta: the device side
keeps each sequence's tokens and block tables (engine/execution/device_state.py), so a sequence's
prompt is sent once (`NewSequence`), and afterwards each step sends only the tokens it gained and
how its block tables changed (`ScheduledRow`).

Per-row features are typed fields, never constructor arguments threaded through the classes:
the drafts a row verifies (`draft_token_ids`), the grammar bitmask of a constrained sample
(`StepRecord.grammar_bitmasks`), the adapter a row runs under (`adapter_slot`). A new feature is
a new field here, filled by the scheduler and read by whoever needs it.

`needs_logits` has one meaning everywhere: the step computes the sequence's last known token, so
a token is sampled from that row's logits (and, with drafts, one per draft).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferd.engine.scheduling.kv_cache import NULL_BLOCK
from inferd.lora_request import LoRARequest
from inferd.multimodal.image_input import ImageInput
from inferd.outputs import Logprob, PositionLogprobs
from inferd.pooling_params import PoolingParams
from inferd.sampling_params import SamplingParams

BASE_MODEL = 0  # adapter_slot of a row that runs the model's own weights


@dataclass
class BlockUpdate:
    """How one block table changed since the device side last saw it:

        table = table[:keep] + append;  table[:nulls] = NULL_BLOCK

    which covers every change the KV manager makes: blocks appended, blocks behind a sliding
    window released (leading entries become NULL_BLOCK), a tail of rejected-draft blocks given
    back, a whole new table after preemption or a fork."""

    nulls: int
    keep: int
    append: list[int]

    def apply(self, table: list[int]) -> list[int]:
        out = table[: self.keep] + self.append
        if self.nulls:
            out[: self.nulls] = [NULL_BLOCK] * self.nulls
        return out


def diff_table(old: list[int], new: list[int]) -> BlockUpdate | None:
    """The update that turns `old` into `new`; None when they are equal."""
    if old == new:
        return None
    nulls = 0
    while nulls < len(new) and new[nulls] == NULL_BLOCK:
        nulls += 1
    shared = min(len(old), len(new))
    keep = min(nulls, shared)
    while keep < shared and old[keep] == new[keep]:
        keep += 1
    return BlockUpdate(nulls, keep, new[keep:])


@dataclass
class KVLoad:
    """Blocks read from a KV tier (engine/kv_tiers/), to write into fresh pool blocks after
    clearing and before the step runs: row j of `rows` (ModelRunner.read_blocks' layout) goes
    to `blocks[g][j]` of each group g (NULL_BLOCK: that group does not need it). Rank 0 only:
    the tiers are refused with tensor parallelism."""

    blocks: list[list[int]]
    rows: object  # a [len(blocks[0]), block bytes] uint8 tensor


@dataclass
class NewSequence:
    """A sequence the device side has not seen, sent once: in the step that first schedules it
    or, for samples 2..n of a request, in the step whose logits row they first draw from."""

    seq_id: int
    prompt_token_ids: list[int]  # empty for a fork: it is `fork_of`'s prompt
    params: SamplingParams
    seed: int | None = None  # this sample's seed (request seed + sample index), None: unseeded
    fork_of: int | None = None  # the sequence whose prompt (and logits row) a fork starts from
    # An embedding request (resolved params): its rows never need logits; the step that
    # computes its last prompt token returns its embedding (`ModelRunnerOutput.embeddings`).
    pooling: PoolingParams | None = None
    # The prompt's images (inferd/multimodal/image_input.py), sent once like the prompt; the
    # device side encodes each when a row first computes its placeholders.
    images: list[ImageInput] = field(default_factory=list)


@dataclass
class ScheduledRow:
    """One sequence's share of a step."""

    seq_id: int
    num_computed: int  # tokens already in the KV cache: the step's first position
    num_new_tokens: int  # known tokens computed now (drafts not counted)
    # Tokens the sequence gained since the device side last saw it (usually the one sampled in
    # the previous step; after a preemption, everything generated meanwhile).
    new_token_ids: list[int] = field(default_factory=list)
    # Per KV group; None when no table changed.
    block_updates: list[BlockUpdate | None] | None = None
    needs_logits: bool = False
    # The logits of every computed token too (prompt logprobs of a prompt chunk).
    prompt_logprobs: bool = False
    # Speculative decoding: drafts computed after the sequence's last token, one logits row each.
    draft_token_ids: list[int] = field(default_factory=list)
    # n > 1: samples 1..n-1 of the request, starting now, each drawing its first token from this
    # row's logits (their NewSequence comes in the same record).
    fork_seq_ids: list[int] = field(default_factory=list)
    # Which LoRA slot's adapter the row runs under; BASE_MODEL: the model's own weights only.
    adapter_slot: int = BASE_MODEL

    @property
    def sample_ids(self) -> list[int]:
        """The sequences that draw a token from this row's logits, in sampling order."""
        return [self.seq_id, *self.fork_seq_ids] if self.needs_logits else []


@dataclass
class StepRecord:
    rows: list[ScheduledRow] = field(default_factory=list)
    new_sequences: list[NewSequence] = field(default_factory=list)
    # Sequences the device side may forget: finished, aborted or failed since the last record.
    finished_seq_ids: list[int] = field(default_factory=list)
    # Per KV group: blocks handed out for the first time, to zero before the step runs.
    blocks_to_clear: list[list[int]] = field(default_factory=list)
    # (group, source, destination) KV blocks to copy, after clearing and before the step runs:
    # the partly filled last block of a parent for each fork started by the previous step.
    block_copies: list[tuple[int, int, int]] = field(default_factory=list)
    # Structured outputs: sample seq_id → its grammar's token bitmask for this step (int32
    # words, little-endian bytes; bit t % 32 of word t // 32 allows token t).
    grammar_bitmasks: dict[int, bytes] = field(default_factory=dict)
    # Sequences this step preempted (their blocks are gone; the device side keeps their state).
    preempted_seq_ids: list[int] = field(default_factory=list)
    # LoRA: (slot, adapter) to load into a slot before the step runs (it replaces what the slot
    # held; the scheduler evicts only slots no unfinished request uses).
    adapter_loads: list[tuple[int, LoRARequest]] = field(default_factory=list)
    # Blocks from a KV tier to write into the pool before the step runs (engine/kv_tiers/).
    kv_loads: list[KVLoad] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """Tokens the step computes, drafts included."""
        return sum(r.num_new_tokens + len(r.draft_token_ids) for r in self.rows)

    @property
    def sample_ids(self) -> list[int]:
        """Who gets tokens this step, in the order of `ModelRunnerOutput.sampled_token_ids`."""
        return [seq_id for r in self.rows for seq_id in r.sample_ids]

    def for_workers(self) -> StepRecord:
        """What a tensor-parallel worker needs: everything but the sampling-only fields."""
        return StepRecord(self.rows, self.new_sequences, self.finished_seq_ids,
                          self.blocks_to_clear, self.block_copies,
                          adapter_loads=self.adapter_loads)  # fmt: skip


@dataclass
class TokenLogprobs:
    """Logprobs at one position: the chosen (or prompt) token first, then the top alternatives
    asked for, in rank order; parallel lists, as they cross the process boundary."""

    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int]

    @classmethod
    def of(cls, entry: PositionLogprobs) -> TokenLogprobs:
        return cls(list(entry), [lp.logprob for lp in entry.values()],
                   [lp.rank for lp in entry.values()])  # fmt: skip

    def position(self, decoded: list[str | None] | None = None) -> PositionLogprobs:
        """As the user sees it: token id → Logprob, with each token's text when given."""
        names = decoded or [None] * len(self.token_ids)
        return {t: Logprob(v, r, d) for t, v, r, d in
                zip(self.token_ids, self.logprobs, self.ranks, names, strict=True)}  # fmt: skip


@dataclass
class ModelRunnerOutput:
    # One list per entry of `StepRecord.sample_ids`: the tokens drawn for that sequence (one,
    # or after verifying drafts: the accepted drafts and the token that follows them).
    sampled_token_ids: list[list[int]]
    # Same order, one entry per sampled token; None where the request asked for no logprobs.
    # May be left empty when no request asked. (In the core's process only: the scheduler
    # turns these into TokenLogprobs for the front end.)
    logprobs: list[list[PositionLogprobs] | None] = field(default_factory=list)
    # seq_id → logprobs of the prompt tokens this step's positions predict (prompt_logprobs).
    prompt_logprobs: dict[int, list[PositionLogprobs]] = field(default_factory=dict)
    # What the step took (wall seconds): the model, the sampler. Speculative decoding plans
    # how many drafts are worth a row from these (spec_decode/planner.py).
    forward_seconds: float = 0.0
    sampling_seconds: float = 0.0
    # seq_id → the embedding of a pooling sequence whose prompt this step finished.
    embeddings: dict[int, list[float]] = field(default_factory=dict)
