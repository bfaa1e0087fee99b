"""The flags of `inferd serve --disaggregate` (prefill and decode on separate engine cores:
engine/disaggregation/, docs/distributed.md) and the checks that refuse what cannot work with
them, before anything loads."""

from __future__ import annotations

import argparse

from inferd.engine.disaggregation.routing import DEFAULT_MIN_PROMPT

# flags (by their argparse name) that --disaggregate cannot serve yet, and why
_REFUSED = {
    "ray": "disaggregated serving runs on one host for now (engine core processes); Ray "
    "deployments for it are not built yet",
    "enable_lora": "a prefill and a decode engine would both need every adapter",
    "wake_on_request": "sleep is not supported with --disaggregate",
    "models_dir": "one disaggregated server serves one model",
}


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from e
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text!r}")
    return value


def _tokens(text: str) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from e
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def add_disaggregation_arguments(parser: argparse.ArgumentParser) -> None:
    # NOTE: the counts default to None so that one given without --disaggregate is refused.
    g = parser.add_argument_group("prefill/decode disaggregation (docs/distributed.md)")
    g.add_argument(
        "--disaggregate",
        action="store_true",
        help="compute prompts on prefill engine cores and generate on decode engine cores, "
        "the KV blocks handed over through shared memory (default: off; every engine does "
        "both)",
    )
    g.add_argument(
        "--prefill-engines",
        type=_count,
        default=None,
        help="engine core processes that compute prompts, with --disaggregate (default: 1)",
    )
    g.add_argument(
        "--decode-engines",
        type=_count,
        default=None,
        help="engine core processes that generate tokens, with --disaggregate (default: 1)",
    )
    g.add_argument(
        "--disaggregate-min-prompt",
        type=_tokens,
        default=None,
        help="prompts shorter than this many tokens are computed on their decode engine, "
        f"with --disaggregate (default: {DEFAULT_MIN_PROMPT})",
    )


def disaggregates(args: argparse.Namespace) -> bool:
    """Whether `inferd serve` disaggregates; refuses the flags that cannot go with it (or
    its own flags without it)."""
    own = [f for f in ("prefill_engines", "decode_engines", "disaggregate_min_prompt")
           if getattr(args, f, None) is not None]  # fmt: skip
    if not getattr(args, "disaggregate", False):
        if own:
            raise ValueError(f"--{own[0].replace('_', '-')} needs --disaggregate")
        return False
    for flag, why in _REFUSED.items():
        if getattr(args, flag, None):
            raise ValueError(f"--disaggregate with --{flag.replace('_', '-')}: {why}")
    from inferd.commands.serve_model_flags import serves_many

    if serves_many(args):
        raise ValueError("--disaggregate with several models (--model NAME=PATH, "
                         f"--models-dir): {_REFUSED['models_dir']}")  # fmt: skip
    if args.data_parallel_size != 1:
        raise ValueError("--disaggregate sets the engines with --prefill-engines and "
                         "--decode-engines: drop --data-parallel-size")  # fmt: skip
    if not args.engine_core_process:
        raise ValueError("--disaggregate needs engine core processes: drop "
                         "--no-engine-core-process")  # fmt: skip
    return True


def disaggregated_client(config, args: argparse.Namespace):
    """The started client of a disaggregated server (its engines loaded)."""
    from inferd.engine.disaggregation.client import DisaggregatedClient

    min_prompt = args.disaggregate_min_prompt
    client = DisaggregatedClient(config, args.prefill_engines or 1, args.decode_engines or 1,
                                 DEFAULT_MIN_PROMPT if min_prompt is None else min_prompt,
                                 args.stall_timeout)  # fmt: skip
    client.launch()
    return client
