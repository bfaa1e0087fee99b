"""Structured outputs under `inferd bench latency | throughput --structured-outputs SPEC`: the
same workload run by the same engine twice, each reply constrained by SPEC and free, iterations
alternating, so the table's ratio is the constrained stream's tokens/s against the free one's.

A constrained reply cannot ignore EOS (the grammar decides when it ends), so a spec meant for
timing must not let the reply end before `output_len` tokens: the `json` preset
(inferd/bench/presets.py) asks for an object holding one string longer than any output
(`minLength`), so every token is constrained (the key, the quotes, then what a JSON string may
hold) and every request generates exactly its output length.
"""

from __future__ import annotations

import json

from inferd.bench.systems import InferdSystem
from inferd.bench.workload import BenchRequest
from inferd.sampling_params import SamplingParams
from inferd.structured_params import StructuredOutputsParams


def parse_spec(text: str) -> StructuredOutputsParams:
    """`--structured-outputs` as JSON: StructuredOutputsParams' fields, e.g. '{"regex": "..."}'
    or '{"json": {...schema...}}' (ValueError naming the problem)."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"--structured-outputs must be JSON: {e}") from e
    return StructuredOutputsParams.from_dict(value)


class ConstrainedSystem(InferdSystem):
    """The engine of `base`, every request following `spec` (sampled as the base samples, up to
    output_len)."""

    def __init__(self, base: InferdSystem, spec: StructuredOutputsParams):
        # NOTE: shares the loaded LLM with `base`: one engine, two ways of sampling.
        self.llm, self.spec = base.llm, spec
        # The base's sampling; no trace of its own (the CLI refuses --profile here).
        self.temperature, self.profile_dir, self.trace = base.temperature, None, None
        self._measuring, self._spent = False, None
        self.name = f"inferd+{spec.kind}"
        self.load_seconds = base.load_seconds
        self.info = {**base.info, "structured_outputs": spec.kind}
        self.llm.engine.check_grammar(self.sampling_params(BenchRequest([0], 1)))  # compile now

    def prompt(self, request: BenchRequest) -> dict:
        # NOTE: both systems get the same prompts in an iteration, on one engine: without a salt
        # of its own, whichever ran second would find the prompt in the prefix cache.
        return {"prompt_token_ids": request.prompt_token_ids, "cache_salt": self.name}

    def sampling_params(self, request: BenchRequest) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, max_tokens=request.output_len,
                              structured_outputs=self.spec)  # fmt: skip

    def constraint_costs(self) -> str:
        """What the grammar cost per generated token, from the engine's counters."""
        stats = self.llm.engine.grammars.stats
        if stats is None or not stats.tokens:
            return "no constrained token was generated"
        per_token = (stats.constrain_s + stats.accept_s) / stats.tokens * 1e6
        return (
            f"{stats.tokens} constrained tokens: {per_token:.1f} µs per token "
            f"(sampling side {stats.constrain_s / stats.tokens * 1e6:.1f}, grammar advance "
            f"{stats.accept_s / stats.tokens * 1e6:.1f}); {stats.checked} checked first, "
            f"{stats.rejected} of them masked after all, {stats.masked} rows masked in total"
        )

    def close(self) -> None:
        pass
