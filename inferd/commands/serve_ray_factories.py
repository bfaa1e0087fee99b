"""What `inferd serve --ray` runs inside the Ray workers, built from the same flags and helpers
as `inferd serve` (serve_args.py, serve_startup.py): `make_engine` in each engine replica, and
`make_settings` in the ingress, for the model the replicas describe. inferd/ray_serve/ calls them
without knowing the flags (they travel as `functools.partial`s of these functions)."""

from __future__ import annotations

import argparse
import logging
import sys

from inferd.commands.serve_startup import ServedModel, set_chat_template, show_startup_logs


def _worker_logging(args: argparse.Namespace) -> None:
    """A Ray worker has none of the CLI's logging set-up: the same level, format and quiet."""
    from inferd.progress import set_quiet

    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")  # fmt: skip
    set_quiet(args.quiet)
    show_startup_logs()


def make_engine(args: argparse.Namespace):
    """In each replica: the engine as `inferd serve` builds it, behind its EngineClient."""
    from inferd.commands.engine_args import engine_config_from_args
    from inferd.commands.serve_features import with_request_limits
    from inferd.commands.startup_gc import engine_started
    from inferd.engine.frontend.async_engine import AsyncEngine
    from inferd.engine.frontend.llm_engine import LLMEngine
    from inferd.ray_serve.replica import ReplicaEngine
    from inferd.ray_serve.wire import EngineFacts
    from inferd.tokenizer.byte_bound import max_bytes_per_token
    from inferd.tokenizer.template_files import load_chat_template

    _worker_logging(args)
    template = load_chat_template(args.chat_template) if args.chat_template else None
    engine = LLMEngine(with_request_limits(engine_config_from_args(args), args))
    engine_started()
    set_chat_template(ServedModel.of_engine(engine), template)
    # The blocks a prefix hit can cover: the full-attention pool's (sliding layers keep only
    # their window, so it bounds nothing), else the one pool.
    plan, block_size = engine.setup.kv_plan, engine.config.block_size
    blocks = plan.token_capacity // block_size if plan.token_capacity else plan.num_blocks[0]
    facts = EngineFacts(engine.model_config, engine.setup.max_num_seqs, block_size, blocks,
                        max_bytes_per_token(engine.tokenizer.backend))  # fmt: skip
    return ReplicaEngine(AsyncEngine(engine, args.stall_timeout), facts)


def make_settings(args: argparse.Namespace, max_replicas: int, description):
    """In the ingress: `inferd serve`'s ServerSettings, for the model the replicas describe."""
    from types import SimpleNamespace

    from inferd.commands.serve_api import api_settings
    from inferd.commands.serve_batch import batch_settings
    from inferd.commands.serve_features import cors_settings, tool_settings
    from inferd.server.app import DEFAULT_MAX_REQUEST_BYTES, ServerSettings

    _worker_logging(args)
    info, facts = description.model_info, description.facts
    # tool_settings reads the engine's tokenizer and model config only.
    engine_view = SimpleNamespace(tokenizer=description.tokenizer, model_config=facts.model_config)
    model_arg = args.model or args.model_pos
    return ServerSettings(
        served_model_names=args.served_model_name or ([model_arg] if model_arg else []),
        api_key=args.api_key or None,
        max_request_bytes=args.max_request_bytes or DEFAULT_MAX_REQUEST_BYTES,
        log_requests=not args.disable_log_requests,
        tools=tool_settings(engine_view, args),
        cors=cors_settings(args),
        enable_request_timeline=args.enable_request_timeline,
        seats=facts.max_num_seqs * max_replicas,  # every replica's batch at once
        max_queued_requests=args.max_queued_requests,
        max_queued_tokens=max(args.max_queued_tokens, info.max_model_len),
        max_prompts_per_request=args.max_prompts_per_request,
        max_bytes_per_token=facts.max_bytes_per_token,
        shutdown_timeout_s=args.shutdown_timeout,
        api=api_settings(args),
        batch=batch_settings(args),
    )
