"""Engine flags shared by `generate`, `chat`, `serve` and `bench` (vLLM's flag names)."""

from __future__ import annotations

import argparse


def size_arg(text: str) -> int:
    """argparse type: a positive size such as 2GiB, 512MB or 1073741824."""
    from inferd.commands.memory import parse_size

    try:
        value = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    if value < 1:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from e
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_engine_arguments(parser: argparse.ArgumentParser, model_positional: bool = False) -> None:
    if model_positional:
        parser.add_argument("model_pos", nargs="?", metavar="MODEL", help="model path")
    parser.add_argument(
        "--model", help="GGUF file or HF folder (default: the embedded Gemma 3 270M)"
    )
    parser.add_argument("--dtype", default="auto",
                        help="auto (with --quantization unset: the fastest accurate mode for "
                             "this machine and model, e.g. a GGUF file's own blocks on CPU), "
                             "float32 (HF parity), bfloat16, float16")  # fmt: skip
    parser.add_argument(
        "--device", default=None, help="cpu, cuda, cuda:N (default: cuda if present)"
    )
    parser.add_argument("--max-model-len", type=_positive_int, default=None)
    parser.add_argument("--max-num-seqs", type=_positive_int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=_positive_int, default=None)
    parser.add_argument("--kv-cache-memory", type=size_arg, default=None,
                        help="bytes for the KV cache, e.g. 2GiB (CPU default 2GiB)")  # fmt: skip
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--block-size", type=_positive_int, default=16)
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                        default=True)  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quantization", default=None, choices=["gguf", "int8", "int4", "fp8"],
                        help="force a mode (default: chosen for the machine, see --dtype). "
                             "gguf: only a GGUF file's own blocks, least memory (CPU); int8: "
                             "W8A8 (CPU); int4: weight-only (CPU, lossy); fp8: W8A8 (Hopper "
                             "GPUs)")  # fmt: skip
    parser.add_argument("--kv-cache-dtype", default="auto",
                        help="auto (the model dtype), float32, bfloat16, float16, fp8")  # fmt: skip
    parser.add_argument("--threads", type=_positive_int, default=None, help="CPU threads")
    parser.add_argument("--attention-backend", default="auto",
                        choices=["auto", "torch", "cpu", "triton"],
                        help="torch: plain PyTorch (the reference); cpu: decode attention in C; "
                             "triton: GPU kernels; auto: triton on CUDA, cpu on CPU when the C "
                             "kernels build, else torch")  # fmt: skip
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    parser.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=_positive_int,
        default=1,
        help="split the model across N processes/devices (gloo on CPU, NCCL)",
    )
    parser.add_argument(
        "--distributed-timeout",
        type=float,
        default=None,
        help="seconds a tensor-parallel collective may wait (default 60)",
    )


def engine_config_from_args(args: argparse.Namespace):
    """The EngineConfig of the flags. NOTE: under torchrun (RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT set) a rank other than 0 becomes a tensor-parallel worker right here and exits
    when rank 0 stops, so every command can be launched the same way on every machine."""
    from inferd.config import EngineConfig

    model = args.model or getattr(args, "model_pos", None)
    if args.model and getattr(args, "model_pos", None):
        raise ValueError("give the model either as MODEL or with --model, not both")
    config = EngineConfig(
        model=model,
        dtype=args.dtype,
        device=args.device,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_memory=args.kv_cache_memory,
        gpu_memory_utilization=args.gpu_memory_utilization,
        block_size=args.block_size,
        enable_prefix_caching=args.enable_prefix_caching,
        seed=args.seed,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        num_threads=args.threads,
        attention_backend=args.attention_backend,
        enforce_eager=args.enforce_eager,
        tensor_parallel_size=args.tensor_parallel_size,
        distributed_timeout=args.distributed_timeout,
    )
    from inferd.distributed.launch import env_rank, launched_by_torchrun

    if config.tensor_parallel_size > 1 and launched_by_torchrun() and env_rank() != 0:
        from inferd.engine.tp_workers import torchrun_worker

        torchrun_worker(config)
        raise SystemExit(0)
    return config


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=_positive_int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--repetition-penalty", type=float, default=1.0)
    parser.add_argument("--sample-seed", type=int, default=None, help="seed of this request")
    parser.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true")


def sampling_params_from_args(args: argparse.Namespace):
    from inferd.sampling_params import SamplingParams

    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.sample_seed,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
    )
