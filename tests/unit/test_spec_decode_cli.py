"""vLLM's --speculative-config on every command that runs the engine, `LLM(speculative_config=)`,
and the bench's one-run comparison: values checked before anything loads, errors in one line."""

from __future__ import annotations

import json

import pytest

from inferd import cli
from inferd.commands import engine_args
from inferd.spec_decode import SpeculativeConfig

FLAG = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                   "prompt_lookup_min": 2})  # fmt: skip


def parse(command: str, *flags: str):
    extra = ["x"] if command == "generate" else ["latency"] if command == "bench" else []
    return cli.build_parser(command).parse_args([command, *extra, *flags])


@pytest.mark.parametrize("command", ["generate", "serve", "chat", "bench"])
def test_the_flag_reaches_the_engine_config(command):
    args = parse(command, "--speculative-config", FLAG)
    config = engine_args.engine_config_from_args(args)
    assert config.speculative_config == SpeculativeConfig(4, 4, 2)
    assert engine_args.engine_config_from_args(parse(command)).speculative_config is None


def test_a_bad_value_is_one_line_naming_the_key(capsys):
    with pytest.raises(SystemExit):
        cli.main(["generate", "x", "--speculative-config", '{"method": "ngram"}'])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--speculative-config" in err and "num_speculative_tokens" in err
    with pytest.raises(SystemExit):
        cli.main(["serve", "--speculative-config", "{not json"])
    assert "must be a JSON object" in capsys.readouterr().err


def test_the_offline_api_refuses_a_bad_config_before_loading_the_model():
    from inferd import LLM

    with pytest.raises(ValueError, match="prompt_lookup_min"):
        LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                "prompt_lookup_min": 0})  # fmt: skip


def test_bench_compare_nospec_needs_a_config_and_sampling_only_against_inferd():
    from inferd.commands import bench

    with pytest.raises(ValueError, match="--compare nospec needs --speculative-config"):
        bench.run(parse("bench", "--compare", "nospec"))
    args = parse("bench", "--speculative-config", FLAG, "--compare", "nospec,llamacpp",
                 "--temperature", "1")  # fmt: skip
    with pytest.raises(ValueError, match="decode greedily only"):
        bench.run(args)
    with pytest.raises(SystemExit):
        parse("bench", "--temperature", "-1")


def test_bench_startup_hands_the_config_on_to_generate():
    from inferd.commands.engine_args import engine_flags_of

    args = cli.build_parser("bench").parse_args(["bench", "startup", "--speculative-config", FLAG])
    flags = engine_flags_of(args)
    assert json.loads(flags[flags.index("--speculative-config") + 1]) == json.loads(FLAG)


def test_bench_startup_hands_every_engine_flag_it_was_given_on_to_generate():
    from inferd.commands.engine_args import engine_flags_of

    given = ["--kv-cache-memory", "1GiB", "--no-enable-prefix-caching", "--enforce-eager",
             "--dtype", "float32", "-tp", "2", "--attention-backend", "torch",
             "--speculative-config", FLAG]  # fmt: skip
    args = cli.build_parser("bench").parse_args(["bench", "startup", *given])
    again = cli.build_parser("generate").parse_args(["generate", "x", *engine_flags_of(args)])
    for name in ("kv_cache_memory", "enable_prefix_caching", "enforce_eager", "dtype",
                 "tensor_parallel_size", "attention_backend"):  # fmt: skip
        assert getattr(again, name) == getattr(args, name)
    assert again.speculative_config.to_dict() == args.speculative_config.to_dict()
    defaults = cli.build_parser("bench").parse_args(["bench", "startup"])
    assert engine_flags_of(defaults) == []
