"""The standard workloads of issue 7 as presets, and how flags combine with them.

A preset names a workload so one command measures it the same way every time; any length or
count flag given explicitly overrides the preset's value for that field only.
"""

from __future__ import annotations

from inferd.bench.workload import LengthRange, WorkloadSpec

PRESETS: dict[str, dict] = {
    # Offline throughput: 32 requests, prompts 16–256, outputs 16–128 tokens (EOS ignored).
    "throughput32": dict(num_prompts=32, input_len=(16, 256), output_len=(16, 128)),
    # One stream: 128 prompt tokens, then 128 generated (run it with `bench latency`).
    "single": dict(num_prompts=1, input_len=(128, 128), output_len=(128, 128)),
    # Prefill: time to the first token of a 512-token prompt (max_tokens=1).
    "prefill512": dict(num_prompts=1, input_len=(512, 512), output_len=(1, 1)),
    # Copy-heavy, one stream: fix the typos of a ~256-token text; the 192-token answer copies it
    # (where n-gram speculative decoding pays; run it with `bench latency`).
    "copy": dict(num_prompts=1, input_len=(256, 256), output_len=(192, 192), dataset="copy"),
    # Structured outputs, one stream: `single`, run constrained to a JSON object holding one long
    # string (inferd/bench/constrained.py) and free, alternating (run it with `bench latency`).
    "json": dict(
        num_prompts=1,
        input_len=(128, 128),
        output_len=(128, 128),
        structured_outputs={
            "json": {
                "type": "object",
                "required": ["answer"],
                "properties": {"answer": {"type": "string", "minLength": 4096}},
            }
        },
    ),
}
# Multi-turn chat, 16 conversations at once of 6 turns each, every turn resending the history
# (a start of 128-384 tokens, then the answer + 32 question tokens a turn; answers of 32-96
# tokens): serve it with `bench serve` against `serve --data-parallel-size 2` to compare
# --data-parallel-routing. NOTE: lengths vary as in real chats. With fixed ones, every
# conversation a replica holds finishes its turn in the same step, so their next turns all
# arrive at once and share one prefill: a lock step no real traffic has, which makes
# affinity look worse on TTFT than it is.
PRESETS["multiturn"] = dict(num_prompts=16, input_len=(128, 384), output_len=(32, 96),
                            dataset="multiturn", turns=6)  # fmt: skip
DEFAULT_LEN = 128


def resolve_workload(
    preset: str | None,
    *,
    input_len: int | None,
    output_len: int | None,
    range_ratio: float,
    num_prompts: int | None,
    seed: int,
    default_prompts: int,
) -> WorkloadSpec:
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    chosen = PRESETS.get(preset or "", {})

    def lengths(name: str, given: int | None) -> LengthRange:
        if given is not None:
            return LengthRange.around(given, range_ratio)
        if name in chosen:
            return LengthRange(*chosen[name])
        return LengthRange.around(DEFAULT_LEN, range_ratio)

    return WorkloadSpec(
        num_prompts or chosen.get("num_prompts") or default_prompts,
        lengths("input_len", input_len),
        lengths("output_len", output_len),
        seed=seed,
        dataset=chosen.get("dataset", "random"),
        turns=chosen.get("turns", 1),
    )
