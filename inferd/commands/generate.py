"""`inferd generate PROMPT`: stream the continuation of one prompt to stdout.

Only generated text goes to stdout; logs and the timing summary go to stderr, so the output can
be piped. Sampling defaults come from the model's generation_config.json when it has one, else
greedy with a 1.1 repetition penalty (engine_args.GENERATE_FALLBACK; `--help` states it).
"""

from __future__ import annotations

import argparse
import sys
import time

from inferd.commands.engine_args import (
    GENERATE_FALLBACK,
    add_engine_arguments,
    add_sampling_arguments,
    engine_config_from_args,
    model_sampling_defaults,
    sampling_params_from_args,
)
from inferd.commands.startup_gc import engine_started


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the prompt text ('-' reads it from stdin)")
    add_engine_arguments(parser)
    add_sampling_arguments(parser, GENERATE_FALLBACK)
    parser.add_argument(
        "--profile",
        metavar="DIR",
        default=None,
        help="write a torch.profiler trace of the generation (and its top-ops table) to DIR "
        "(default: none; docs/profiling.md)",
    )


def run(args: argparse.Namespace) -> int:
    start = time.monotonic()
    from inferd.engine.frontend.llm_engine import LLMEngine

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    sampling_params_from_args(args)  # bad flags fail here, before the model loads
    if args.profile:
        from inferd.profiling.trace import trace_directory

        trace_directory(args.profile)  # an unwritable directory fails before the model loads
    engine = LLMEngine(engine_config_from_args(args))
    engine_started()
    params = sampling_params_from_args(args, model_sampling_defaults(engine))
    if args.profile:
        engine.start_profile(args.profile)
    ready = time.monotonic()
    engine.add_request("cli", prompt, params, stream=True)
    sent, first_token_at, out = 0, None, None
    while engine.has_unfinished_requests():
        for out in engine.step():
            text = out.outputs[0].text
            if len(text) > sent:
                sys.stdout.write(text[sent:])
                sys.stdout.flush()
                sent = len(text)
            if first_token_at is None and out.outputs[0].token_ids:
                first_token_at = time.monotonic()
    sys.stdout.write("\n")
    if args.profile:
        report_trace(engine.stop_profile(), args.quiet)
    if out is not None and out.error:
        raise RuntimeError(out.error)
    if not args.quiet and out is not None:
        m = out.metrics
        n = len(out.outputs[0].token_ids)
        decode = (m.last_token_time - m.first_token_time) if n > 1 else 0.0
        rate = f", {(n - 1) / decode:.1f} tok/s decode" if decode > 0 else ""
        print(
            f"[inferd] ready in {ready - start:.2f} s, first token at "
            f"{(first_token_at or ready) - start:.2f} s, {len(out.prompt_token_ids)} prompt + "
            f"{n} generated tokens{rate}, finish: {out.outputs[0].finish_reason}"
            f"{_speculation_summary(engine)}",
            file=sys.stderr,
        )
    return 0


def report_trace(files, quiet: bool, rows: int = 15) -> None:
    """Where a trace went, and (unless quiet) the head of its top-ops table, on stderr."""
    print(f"[inferd] trace of {files.steps} steps: {files.trace}", file=sys.stderr)
    print(f"[inferd] top ops: {files.ops_table}", file=sys.stderr)
    if not quiet:
        lines = files.table.splitlines()
        print("\n".join(lines[: rows + 3] + lines[-2:]), file=sys.stderr)


def _speculation_summary(engine) -> str:
    """`, speculative decoding: ...` with --speculative-config, else empty."""
    if engine.speculation is None:
        return ""
    m = engine.speculation.metrics
    if m.num_drafts == 0:
        return ", speculative decoding: no drafts"
    return (f", speculative decoding: {m.acceptance_rate:.0%} of {m.num_draft_tokens} draft "
            f"tokens accepted, {m.mean_acceptance_length:.2f} tokens per verification")  # fmt: skip
