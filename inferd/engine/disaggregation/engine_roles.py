"""The engines of a disaggregated server and what their configuration must allow, checked
before anything loads.

    engines 0 .. P-1        prefill: compute prompts, their full blocks saved (write-through)
                            into the transfer tier
    engines P .. P+D-1      decode: load those blocks, compute the rest, sample every token

Each engine is an engine core process like a data-parallel replica (the cores are split
between them as --data-parallel-size does). The transfer tier is the KV connector's RAM tier
(a folder in /dev/shm every engine of the server opens): --kv-offload-memory bounds it, and
without that flag it gets DEFAULT_TRANSFER_MEMORY.
"""

from __future__ import annotations

from dataclasses import replace

from inferd.config import EngineConfig

DEFAULT_TRANSFER_MEMORY = 1 << 30
PREFILL, DECODE = "prefill", "decode"


def engine_roles(prefill_engines: int, decode_engines: int) -> list[str]:
    return [PREFILL] * prefill_engines + [DECODE] * decode_engines


def check_disaggregation(config: EngineConfig, prefill_engines: int, decode_engines: int,
                         min_prompt: int) -> None:  # fmt: skip
    """Refuse what cannot work, naming the flag."""
    if prefill_engines < 1 or decode_engines < 1:
        raise ValueError("--disaggregate needs at least one prefill and one decode engine "
                         f"(--prefill-engines {prefill_engines}, --decode-engines "
                         f"{decode_engines})")  # fmt: skip
    if min_prompt < 0:
        raise ValueError(f"--disaggregate-min-prompt must be >= 0, got {min_prompt}")
    if not config.enable_prefix_caching:
        raise ValueError("--disaggregate hands KV blocks over by their prefix-cache names: it "
                         "needs prefix caching (drop --no-enable-prefix-caching)")  # fmt: skip
    if config.tensor_parallel_size > 1:
        raise ValueError("--disaggregate with --tensor-parallel-size > 1 is not supported: the "
                         "KV connector moves whole blocks, and each rank holds a slice of "
                         "every block")  # fmt: skip
    if config.enable_lora:
        raise ValueError("--disaggregate with --enable-lora is not supported yet: a prefill "
                         "and a decode engine would both need every adapter")  # fmt: skip


def transfer_config(config: EngineConfig) -> EngineConfig:
    """The engines' configuration: a RAM tier (the transfer tier) whatever the flags said."""
    if config.kv_offload_memory:
        return config
    return replace(config, kv_offload_memory=DEFAULT_TRANSFER_MEMORY)
