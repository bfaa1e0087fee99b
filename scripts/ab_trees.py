r"""Wall time of the same engine work under this tree and an earlier one, alternated in one
process: a 512-token prefill (`--work prefill`) or a 128-token prompt then 128 greedy tokens
(`--work decode`), embedded model, default mode. Alternating the two in one process puts both
under the same machine state, which on a shared machine moves more than most changes do
(docs/performance.md); quote the ratio of the medians.

The earlier tree is a copy of its `inferd` renamed so that both import, as for
scripts/bench_block_kernels.py:

    git archive <commit> inferd | tar -x -C /tmp/e && mv /tmp/e/inferd /tmp/e/inferd_old
    grep -rl inferd /tmp/e/inferd_old | xargs sed -i -E 's/\binferd\./inferd_old./g'
    PYTHONPATH=/tmp/e python scripts/ab_trees.py --earlier inferd_old --work prefill
"""

from __future__ import annotations

import argparse
import importlib
import random
import statistics
import time

WORK = {"prefill": (512, 1), "decode": (128, 128)}  # prompt tokens, generated tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--earlier", required=True, help="an earlier tree's inferd, renamed")
    parser.add_argument("--work", choices=sorted(WORK), default="prefill")
    parser.add_argument("--rounds", type=int, default=20, help="runs of each tree")
    args = parser.parse_args()
    prompt, generated = WORK[args.work]
    ids = [random.Random(0).randrange(1000, 20000) for _ in range(prompt)]
    engines = {}
    for name, package in (("earlier", args.earlier), ("this", "inferd")):
        module = importlib.import_module(package)
        llm = module.LLM(enable_prefix_caching=False)
        params = module.SamplingParams(max_tokens=generated, temperature=0.0, ignore_eos=True)
        llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)  # warm-up
        engines[name] = (llm, params)
    seconds = {name: [] for name in engines}
    for i in range(args.rounds):
        for name in ("earlier", "this") if i % 2 else ("this", "earlier"):
            llm, params = engines[name]
            start = time.perf_counter()
            llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
            seconds[name].append(time.perf_counter() - start)
    earlier, this = (statistics.median(seconds[name]) for name in ("earlier", "this"))
    print(f"{args.work}: earlier {earlier * 1e3:.1f} ms, this tree {this * 1e3:.1f} ms "
          f"(medians of {args.rounds}); earlier / this {earlier / this:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
