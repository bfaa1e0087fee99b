"""Engine flags shared by `generate`, `chat`, `serve` and `bench` (vLLM's flag names)."""

from __future__ import annotations

import argparse


def size_arg(text: str) -> int:
    """argparse type: a positive size such as 2GiB, 512MB or 1073741824."""
    from inferd.sizes import parse_size

    try:
        value = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    if value < 1:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return value


def cache_size_arg(text: str) -> int:
    """argparse type: a size that may be 0 (nothing cached)."""
    from inferd.sizes import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from e
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def speculative_config_arg(text: str):
    """argparse type: vLLM's --speculative-config JSON, checked (inferd/spec_decode/config.py)."""
    from inferd.spec_decode import SpeculativeConfig

    try:
        return SpeculativeConfig.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def pooler_config_arg(text: str) -> dict:
    """argparse type: vLLM's --pooler-config JSON, checked (inferd/pooling_params.py)."""
    from inferd.pooling_params import pooler_overrides

    try:
        checked = pooler_overrides(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    # JSON-ready again (engine_flags_of writes it back): tuples as lists
    return {k: list(v) if isinstance(v, tuple) else v for k, v in checked.items()}


class _EveryModel(argparse.Action):
    """`--model` as before (the last value in `model`), each value also kept in `models`: a
    server of several models (serve_models.py) reads them all."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001
        setattr(namespace, self.dest, values)
        namespace.models = [*namespace.models, values]  # a new list: the default is shared


def add_engine_arguments(parser: argparse.ArgumentParser, model_positional: bool = False) -> None:
    if model_positional:
        parser.add_argument("model_pos", nargs="?", metavar="MODEL",
                            help="same as --model (default: the embedded model)")  # fmt: skip
    if model_positional:  # `inferd serve`: several models, --model NAME=PATH each
        parser.add_argument(
            "--model",
            action=_EveryModel,
            help="a GGUF file, an HF folder, or a name from `inferd models` such as "
            "smollm2-135m-instruct (default: the embedded Gemma 3 270M, gemma-3-270m); "
            "NAME=PATH serves PATH as NAME, and may be given several times to serve several "
            "models, loaded on request (docs/server.md, Many models)",
        )
        parser.set_defaults(models=[])
    else:
        parser.add_argument(
            "--model",
            help="a GGUF file, an HF folder, or a name from `inferd models` such as "
            "smollm2-135m-instruct (default: the embedded Gemma 3 270M, gemma-3-270m)",
        )
    parser.add_argument("--dtype", default="auto",
                        help="auto (with --quantization unset: the fastest accurate mode for "
                             "this machine and model, e.g. a GGUF file's own blocks on CPU), "
                             "float32 (HF parity), bfloat16, float16")  # fmt: skip
    parser.add_argument(
        "--device", default=None, help="cpu, cuda, cuda:N (default: cuda if present)"
    )
    parser.add_argument("--max-model-len", type=_positive_int, default=None,
                        help="longest prompt + output, in tokens (default: the model's "
                             "context length, lowered to what the KV cache holds)")  # fmt: skip
    parser.add_argument(
        "--max-num-seqs",
        type=_positive_int,
        default=None,
        help="requests in one batch (default: 64 on CPU, 256 on GPU)",
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=_positive_int,
        default=None,
        help="tokens in one engine step (default: 1024 on CPU, 8192 on GPU)",
    )
    parser.add_argument("--kv-cache-memory", type=size_arg, default=None,
                        help="bytes for the KV cache, e.g. 2GiB (CPU default 2GiB)")  # fmt: skip
    parser.add_argument("--kv-offload-memory", type=size_arg, default=None,
                        help="a RAM tier of this many bytes behind the KV cache, shared by the "
                             "server's replicas: computed blocks are kept there and a prompt's "
                             "blocks load back instead of being recomputed "
                             "(default: none)")  # fmt: skip
    parser.add_argument("--kv-offload-dir", default=None,
                        help="a disk tier for KV blocks in this folder (with --kv-offload-disk): "
                             "shared by the replicas, and the next start of the same model "
                             "finds its blocks (default: none)")  # fmt: skip
    parser.add_argument("--kv-offload-disk", type=size_arg, default=None,
                        help="bytes the disk KV tier may hold, least recently used removed "
                             "first (default: none; required with --kv-offload-dir)")  # fmt: skip
    parser.add_argument("--weight-cache-size", type=cache_size_arg, default=None,
                        help="bytes the packed GGUF blocks kept for fast starts may take on disk "
                             "altogether, least recently used removed first; 0: none kept "
                             "(default: INFERD_WEIGHT_CACHE_SIZE, else 32GiB; `inferd cache` "
                             "shows them)")  # fmt: skip
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="share of GPU memory for weights, activations and KV cache",
    )
    parser.add_argument(
        "--block-size", type=_positive_int, default=16, help="tokens per KV cache block"
    )
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="reuse the KV blocks of equal prompt prefixes")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="engine random seed")
    parser.add_argument("--quantization", default=None, choices=["gguf", "int8", "int4", "fp8"],
                        help="force a mode (default: chosen for the machine, see --dtype). "
                             "gguf: only a GGUF file's own blocks, least memory (CPU); int8: "
                             "W8A8 (CPU); int4: weight-only (CPU, lossy); fp8: W8A8 (Hopper "
                             "GPUs); a named model may bring its own")  # fmt: skip
    # the choices are model_setup.KV_CACHE_DTYPES (not imported: `--help` loads no torch)
    parser.add_argument("--kv-cache-dtype", default="auto",
                        choices=["auto", "float32", "bfloat16", "float16", "fp8", "int8"],
                        help="auto: the mode's (bfloat16 with GGUF blocks, else the model "
                             "dtype); float16: GPUs only; fp8: e4m3 (torch and cpu attention "
                             "backends, not --deterministic); int8: a float32 scale per token "
                             "and KV head, about half of bfloat16's memory (every backend, "
                             "--deterministic included; docs/memory.md)")  # fmt: skip
    parser.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        help="CPU threads (default: PyTorch's, one per core)",
    )
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
    parser.add_argument("--stream-interval", type=_positive_int, default=1,
                        help="a streaming request's output after its first token, then every N "
                             "tokens, and when it ends (default 1: every token); larger N, "
                             "fewer events and less CPU spent per token")  # fmt: skip
    parser.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "priority"],
                        help="fcfs: requests start in arrival order, and a request's priority "
                             "must be 0; priority: the lowest `priority` value starts first "
                             "(ties by arrival) and preempts running requests of a lower "
                             "priority when it finds no room (default fcfs)")  # fmt: skip
    parser.add_argument("--deterministic", action="store_true",
                        help="the same tokens for a prompt whatever else runs, in the dense modes "
                             "too (CPU; dense layers in fixed 16-row tiles: slower). The default "
                             "on a GGUF file is so already")  # fmt: skip
    parser.add_argument(
        "--enable-lora",
        action="store_true",
        help="serve LoRA adapters (PEFT folders) over the model",
    )
    parser.add_argument("--max-loras", type=_positive_int, default=1,
                        help="LoRA adapters resident at once (default 1); a request for "
                             "another waits for a slot")  # fmt: skip
    parser.add_argument(
        "--max-lora-rank",
        type=_positive_int,
        default=16,
        help="the largest adapter rank accepted (default 16)",
    )
    parser.add_argument(
        "--max-cpu-loras",
        type=_positive_int,
        default=None,
        help="parsed adapters kept in memory (default: --max-loras)",
    )
    parser.add_argument("--speculative-config", type=speculative_config_arg, default=None,
                        metavar="JSON",
                        help='speculative decoding by n-gram prompt lookup, e.g. \'{"method": '
                             '"ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, '
                             '"prompt_lookup_min": 2}\' (default: off)')  # fmt: skip
    parser.add_argument("--pooler-config", type=pooler_config_arg, default=None, metavar="JSON",
                        help="how /v1/embeddings and LLM.embed pool, over what the model's files "
                             'say: e.g. \'{"pooling_type": "mean", "normalize": true, '
                             '"matryoshka_dimensions": [128, 256]}\' (keys: pooling_type '
                             "last|mean|cls, normalize, is_matryoshka, "
                             "matryoshka_dimensions; default: the model's own)")  # fmt: skip


def engine_flags_of(args: argparse.Namespace) -> list[str]:
    """The engine flags set in `args` (those not at their default), written as a command line
    again: what a command that runs another (`bench startup` → `inferd generate`) hands on, so
    that no engine flag it accepted is lost on the way."""
    import json

    reference = argparse.ArgumentParser(add_help=False)
    add_engine_arguments(reference)
    flags: list[str] = []
    for action in reference._actions:  # NOTE: argparse has no public list of its actions
        value = getattr(args, action.dest, action.default)
        if value == action.default:
            continue
        option = action.option_strings[0]
        if isinstance(action, argparse.BooleanOptionalAction):
            flags.append(option if value else "--no-" + option.removeprefix("--"))
        elif action.nargs == 0:  # store_true
            flags.append(option)
        elif action.dest == "speculative_config":
            flags += [option, json.dumps(value.to_dict())]
        elif action.dest == "pooler_config":
            flags += [option, json.dumps(value)]
        else:
            flags += [option, str(value)]
    return flags


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
        weight_cache_size=args.weight_cache_size,
        kv_offload_memory=args.kv_offload_memory,
        kv_offload_dir=args.kv_offload_dir,
        kv_offload_disk=args.kv_offload_disk,
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
        speculative_config=args.speculative_config,
        pooler_config=args.pooler_config,
        deterministic=args.deterministic,
        stream_interval=args.stream_interval,
        scheduling_policy=args.scheduling_policy,
        # a server flag (serve_args.py): other commands have no queue to bound
        max_queue_time=getattr(args, "max_queue_time", None),
        enable_lora=args.enable_lora,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        max_cpu_loras=args.max_cpu_loras,
    )
    from inferd.loader.catalog import with_engine_defaults

    config = with_engine_defaults(config)  # a short name's settings, where flags left defaults
    from inferd.distributed.launch import env_rank, launched_by_torchrun

    if config.tensor_parallel_size > 1 and launched_by_torchrun() and env_rank() != 0:
        from inferd.engine.execution.tp_workers import torchrun_worker

        torchrun_worker(config)
        raise SystemExit(0)
    return config


# What `generate` samples with when neither the flags nor the model's generation_config.json
# say otherwise: greedy, with llama.cpp's and Ollama's repetition penalty so that a base model
# does not print one sentence until --max-tokens (measured on the embedded model: "What is CUDA?"
# loops at 1.0, reads well at 1.1, emits stray special tokens at 1.2).
GENERATE_FALLBACK = {
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.1,
}
# `chat`: plain greedy. A chat model ends its turn by itself, and the penalty, which also counts
# the prompt's tokens, flips the small chat model's first answer token ("The capital of France
# is Paris." becomes "L'Étoile de la Cité ... The capital is Paris").
CHAT_FALLBACK = {**GENERATE_FALLBACK, "repetition_penalty": 1.0}
_FROM_MODEL = "(default: the model's generation_config.json, else {})"


def add_sampling_arguments(parser: argparse.ArgumentParser, fallback: dict) -> None:
    """Sampling flags default to None: `sampling_params_from_args` fills them from the model's
    generation config, else from `fallback` (which their help states)."""
    parser.add_argument("--max-tokens", type=_positive_int, default=128,
                        help="most tokens to generate")  # fmt: skip
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="0 = greedy " + _FROM_MODEL.format(fallback["temperature"]),
    )
    parser.add_argument("--top-p", type=float, default=None,
                        help=_FROM_MODEL.format(fallback["top_p"]))  # fmt: skip
    parser.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="0 = all tokens " + _FROM_MODEL.format(fallback["top_k"]),
    )
    parser.add_argument("--min-p", type=float, default=None,
                        help=_FROM_MODEL.format(fallback["min_p"]))  # fmt: skip
    parser.add_argument(
        "--repetition-penalty",
        type=float,
        default=None,
        help="1.0 = none; above 1 discourages tokens already in the prompt or "
        "output " + _FROM_MODEL.format(fallback["repetition_penalty"]),
    )
    parser.set_defaults(_sampling_fallback=fallback)
    parser.add_argument(
        "--sample-seed",
        type=int,
        default=None,
        help="seed of this request (default: none, a fresh seed)",
    )
    parser.add_argument("--stop", action="append", default=None,
                        help="stop string, repeatable (default: none; the model's end-of-text "
                             "tokens always stop)")  # fmt: skip
    parser.add_argument(
        "--ignore-eos",
        action="store_true",
        help="keep going past end-of-text tokens up to --max-tokens",
    )


def model_sampling_defaults(engine) -> dict[str, float]:
    """The sampling fields an HF folder's generation_config.json sets (vLLM's
    `--generation-config auto`); GGUF files carry none."""
    import json

    setup = engine.setup
    if setup.checkpoint.format != "hf":
        return {}
    try:
        config = json.loads((setup.checkpoint.path / "generation_config.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    out = {k: config[k] for k in GENERATE_FALLBACK if isinstance(config.get(k), int | float)}
    if config.get("do_sample") is False:
        out["temperature"] = 0.0
    return out


def sampling_params_from_args(args: argparse.Namespace, model_defaults: dict | None = None):
    """Flags first, then the model's generation config, then the command's fallback."""
    from inferd.sampling_params import SamplingParams

    chosen = {**args._sampling_fallback, **(model_defaults or {})}
    for name in GENERATE_FALLBACK:
        if getattr(args, name) is not None:
            chosen[name] = getattr(args, name)
    return SamplingParams(
        max_tokens=args.max_tokens,
        seed=args.sample_seed,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
        **chosen,
    )
