"""How much n-gram lookup a benchmark preset offers the embedded model, without timing anything.

    python scripts/spec_decode_replay.py copy [--num-prompts 8] [--seed 0]

Decodes the preset's prompts greedily once (plain decoding), then replays each output through
the n-gram proposer for a few speculative configs (inferd/spec_decode/simulate.py): under greedy
decoding a draft is accepted exactly as far as it agrees with that output, so the acceptance
speculation would have follows without running it.
"""

from __future__ import annotations

import argparse

from inferd import LLM, SamplingParams
from inferd.bench.presets import PRESETS, resolve_workload
from inferd.bench.workload import make_requests, workload_vocab
from inferd.spec_decode import NgramProposer, SpecDecodeMetrics, SpeculativeConfig
from inferd.spec_decode.simulate import replay_greedy

CONFIGS = [(4, 4, 2), (4, 5, 5), (8, 4, 2)]  # (num_speculative_tokens, lookup max, lookup min)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", choices=sorted(PRESETS))
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    llm = LLM()
    tokenizer = llm.get_tokenizer()
    spec = resolve_workload(
        args.preset,
        input_len=None,
        output_len=None,
        range_ratio=0.0,
        num_prompts=args.num_prompts,
        seed=args.seed,
        default_prompts=1,
    )
    requests = make_requests(spec, workload_vocab(tokenizer), tokenizer)
    params = [
        SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True) for r in requests
    ]
    outputs = llm.generate([r.prompt_token_ids for r in requests], params, use_tqdm=False)
    for k, high, low in CONFIGS:
        config = SpeculativeConfig(k, prompt_lookup_max=high, prompt_lookup_min=low)
        total, steps, tokens = SpecDecodeMetrics(k), 0, 0
        for request, out in zip(requests, outputs, strict=True):
            replay = replay_greedy(
                NgramProposer(config), request.prompt_token_ids, list(out.outputs[0].token_ids)
            )
            total.merge(replay.metrics)
            steps += replay.decode_steps
            tokens += replay.output_tokens - 1
        print(
            f"{args.preset}: {config.to_dict()}: acceptance rate {total.acceptance_rate:.3f}, "
            f"mean acceptance length {total.mean_acceptance_length:.2f}, "
            f"{tokens / steps:.2f} output tokens per decode step, "
            f"{total.num_drafts} of {steps} steps drafted"
        )


if __name__ == "__main__":
    main()
