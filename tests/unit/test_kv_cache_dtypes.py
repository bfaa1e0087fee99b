"""--kv-cache-dtype: what each name resolves to, in every mode that takes it, and what is refused,
naming the flag (engine/execution/model_setup.py, commands/engine_args.py)."""

from __future__ import annotations

import argparse

import pytest
import torch

from inferd.config import EngineConfig
from inferd.engine.execution.model_setup import KV_CACHE_DTYPES, resolve_dtypes, weight_scheme

CPU = torch.device("cpu")


@pytest.mark.parametrize("flags", [{}, {"attention_backend": "torch"},
                                   {"attention_backend": "cpu"}, {"dtype": "float32"}])  # fmt: skip
def test_int8_is_taken_by_every_cpu_mode(flags):
    _, kv = resolve_dtypes(EngineConfig(kv_cache_dtype="int8", **flags), CPU)
    assert kv == torch.int8


def test_int8_is_taken_with_deterministic(c_kernels):
    config = EngineConfig(kv_cache_dtype="int8", deterministic=True, dtype="bfloat16")
    scheme = weight_scheme(config, CPU, None)
    assert resolve_dtypes(config, CPU, scheme)[1] == torch.int8
    with pytest.raises(ValueError, match="fp8 caches"):
        weight_scheme(EngineConfig(kv_cache_dtype="fp8", deterministic=True), CPU, None)


def test_a_dense_kv_dtype_with_the_torch_backend_is_not_a_deterministic_error():
    config = EngineConfig(kv_cache_dtype="float32", attention_backend="torch", dtype="float32")
    assert resolve_dtypes(config, CPU)[1] == torch.float32
    assert resolve_dtypes(EngineConfig(kv_cache_dtype="bf16"), CPU)[1] == torch.bfloat16


def test_what_is_refused_names_the_flag():
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, .*int8; got 'int4'"):
        resolve_dtypes(EngineConfig(kv_cache_dtype="int4"), CPU)
    with pytest.raises(ValueError, match="kv_cache_dtype float16 is not supported on CPU"):
        resolve_dtypes(EngineConfig(kv_cache_dtype="float16"), CPU)


def test_the_cli_offers_the_engines_choices():
    from inferd.commands.engine_args import add_engine_arguments

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    (action,) = [a for a in parser._actions if a.dest == "kv_cache_dtype"]
    assert tuple(action.choices) == KV_CACHE_DTYPES
