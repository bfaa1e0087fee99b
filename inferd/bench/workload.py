"""Benchmark workloads. Three datasets:

- "random", as vLLM's: each request gets a prompt of random ordinary token ids and an output
  length, both drawn uniformly from a range. Prompts are token-id lists, never text: decoding
  random ids and re-encoding the text changes the count, and the benchmark must feed every
  system exactly the same number of tokens.
- "copy": an editing task whose answer copies its prompt (copy_text.py): the case n-gram
  speculative decoding is for. The prompt is text, encoded once by the model's tokenizer into
  the ids every system gets; its length is the input length rounded up to a whole sentence.
- "multiturn": conversations (`num_prompts` of them) of `turns` requests each, every turn
  resending the whole history: the previous turn's prompt, then `output_len` tokens standing in
  for the answer, then `USER_TURN_TOKENS` of a new question (random ids; the answer is the
  client's stand-in, not what the server generated, so only the previous prompts' blocks can be
  found in a prefix cache). Served one turn after another per conversation, conversations at
  once (`inferd bench serve`): the case prefix-cache routing over replicas is for.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from inferd.bench.copy_text import edit_prompt, edit_sentences

DATASETS = ("random", "copy", "multiturn")
USER_TURN_TOKENS = 32  # multiturn: the new question each turn adds after the answer


@dataclass(frozen=True)
class LengthRange:
    """Inclusive bounds [low, high] of a length."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ValueError(
                f"a length range needs 1 <= low <= high, got [{self.low}, {self.high}]"
            )

    @classmethod
    def around(cls, length: int, range_ratio: float) -> LengthRange:
        """vLLM's `--range-ratio`: uniform in [floor(len·(1−r)), ceil(len·(1+r))], at least 1."""
        if length < 1:
            raise ValueError(f"length must be >= 1, got {length}")
        if not 0.0 <= range_ratio < 1.0:
            raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
        # Rounding first keeps 72·(1 − 56/72) at 16, not 15.999… → 15.
        low = math.floor(round(length * (1 - range_ratio), 9))
        high = math.ceil(round(length * (1 + range_ratio), 9))
        return cls(max(1, low), max(1, high))

    def __str__(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int  # tokens to generate, EOS ignored

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class WorkloadSpec:
    num_prompts: int
    input_len: LengthRange
    output_len: LengthRange
    seed: int = 0
    dataset: str = "random"
    turns: int = 1  # multiturn: requests per conversation

    def __post_init__(self) -> None:
        if self.num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {self.num_prompts}")
        if self.turns < 1:
            raise ValueError(f"turns must be >= 1, got {self.turns}")
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {', '.join(DATASETS)}, got {self.dataset!r}")

    def to_dict(self) -> dict:
        return {
            "num_prompts": self.num_prompts,
            "input_len": [self.input_len.low, self.input_len.high],
            "output_len": [self.output_len.low, self.output_len.high],
            "seed": self.seed,
            "dataset": self.dataset,
            "turns": self.turns,
        }


def ordinary_token_ids(vocab_size: int, special_ids: Iterable[int]) -> np.ndarray:
    """Every id in [0, vocab_size) that is not a special/control token (BOS, EOS, pad, unused
    slots, image markers): the ids ordinary text can tokenize to."""
    keep = np.ones(vocab_size, dtype=bool)
    special = np.fromiter((i for i in special_ids if 0 <= i < vocab_size), dtype=np.int64)
    keep[special] = False
    ids = np.flatnonzero(keep)
    if ids.size == 0:
        raise ValueError("the vocabulary has no ordinary tokens to draw prompts from")
    return ids


def random_requests(
    spec: WorkloadSpec, vocab_ids: Sequence[int] | np.ndarray
) -> list[BenchRequest]:
    """The same spec and vocabulary always give the same requests (numpy's PCG64 stream)."""
    vocab = np.asarray(vocab_ids, dtype=np.int64)
    rng = np.random.default_rng(spec.seed)
    # Lengths first, then tokens, so changing the vocabulary does not change the lengths.
    in_lens = rng.integers(spec.input_len.low, spec.input_len.high + 1, size=spec.num_prompts)
    out_lens = rng.integers(spec.output_len.low, spec.output_len.high + 1, size=spec.num_prompts)
    return [
        BenchRequest(vocab[rng.integers(0, vocab.size, size=int(n))].tolist(), int(m))
        for n, m in zip(in_lens, out_lens, strict=True)
    ]


def workload_vocab(tokenizer) -> np.ndarray:
    """Ordinary ids of an inferd (or HF) tokenizer: anything with `len()`, added tokens
    included, and `all_special_ids`."""
    return ordinary_token_ids(len(tokenizer), tokenizer.all_special_ids)


def make_requests(
    spec: WorkloadSpec, vocab_ids: Sequence[int] | np.ndarray, tokenizer
) -> list[BenchRequest]:
    """The requests of `spec` from its dataset: random ids from `vocab_ids`, or copy prompts
    encoded by `tokenizer` (anything with `encode(text) -> ids`)."""
    if spec.dataset == "copy":
        return copy_requests(spec, tokenizer)
    if spec.dataset == "multiturn":
        return [r for turns in conversations(spec, vocab_ids) for r in turns]
    return random_requests(spec, vocab_ids)


def conversations(spec: WorkloadSpec, vocab_ids: Sequence[int] | np.ndarray
                  ) -> list[list[BenchRequest]]:  # fmt: skip
    """The multiturn dataset: per conversation, its turns in order (see the module docstring);
    the same spec and vocabulary always give the same conversations."""
    vocab = np.asarray(vocab_ids, dtype=np.int64)
    rng = np.random.default_rng(spec.seed)

    def draw(n: int) -> list[int]:
        return vocab[rng.integers(0, vocab.size, size=n)].tolist()

    out = []
    for _ in range(spec.num_prompts):
        first = int(rng.integers(spec.input_len.low, spec.input_len.high + 1))
        history, turns = draw(first), []
        for _ in range(spec.turns):
            answer = int(rng.integers(spec.output_len.low, spec.output_len.high + 1))
            turns.append(BenchRequest(list(history), answer))
            history += draw(answer) + draw(USER_TURN_TOKENS)
        out.append(turns)
    return out


def copy_requests(spec: WorkloadSpec, tokenizer) -> list[BenchRequest]:
    """Edit prompts of about `input_len` tokens (whole sentences: at least the length drawn,
    and at least one sentence), each a different text for the seed and request."""
    rng = random.Random(spec.seed)
    in_lens = [
        rng.randint(spec.input_len.low, spec.input_len.high) for _ in range(spec.num_prompts)
    ]
    out_lens = [
        rng.randint(spec.output_len.low, spec.output_len.high) for _ in range(spec.num_prompts)
    ]
    requests = []
    for target, output_len in zip(in_lens, out_lens, strict=True):
        text_seed = rng.getrandbits(64)
        count = target // 8 + 2  # sentences: enough unless a sentence is under 8 tokens
        while True:
            # The same seed writes the same text, longer: the shorter one is its prefix.
            sentences = edit_sentences(random.Random(text_seed), count)
            if len(tokenizer.encode(edit_prompt(sentences))) >= target:
                break
            count *= 2
        ids = _shortest_prompt_reaching(sentences, target, tokenizer)
        requests.append(BenchRequest(ids, output_len))
    return requests


def _shortest_prompt_reaching(sentences: list[str], target: int, tokenizer) -> list[int]:
    """The prompt of the fewest leading sentences whose encoding has >= target tokens (its
    length grows with the sentences, so a binary search over the count finds it)."""

    def encode(count: int) -> list[int]:
        return [int(t) for t in tokenizer.encode(edit_prompt(sentences[:count]))]

    low, high = 1, len(sentences)
    best = encode(high)  # NOTE: always the encoding of `high` sentences
    if len(best) < target:
        raise ValueError(f"a copy prompt of {len(best)} tokens cannot reach {target}")
    while low < high:
        mid = (low + high) // 2
        ids = encode(mid)
        if len(ids) >= target:
            best, high = ids, mid
        else:
            low = mid + 1
    return best
