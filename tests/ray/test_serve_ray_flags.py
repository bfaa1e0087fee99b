"""`inferd serve --ray` flags and the `serve run` builder's arguments: every one honoured or
refused with a message naming it, before any cluster starts; the Serve config file in docs/ is
one `serve deploy` accepts and builds (no cluster: building an application is local)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from inferd.cli import main
from inferd.commands import serve
from inferd.commands.serve_ray import (
    _RaisingParser,
    builder_argv,
    parse_builder_args,
    ray_options,
    uses_ray,
)
from inferd.ray_serve.options import RayOptions

ROOT = Path(__file__).resolve().parents[2]


def _parser() -> argparse.ArgumentParser:
    parser = _RaisingParser(add_help=False)
    serve.add_arguments(parser)
    return parser


def _args(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(list(argv))


def test_builder_arguments_become_inferd_serve_flags():
    argv = builder_argv(
        {
            "model": "smollm2-135m-instruct",
            "num-replicas": 2,
            "enable_prefix_caching": "false",
            "enable_auto_tool_choice": True,
            "disable_log_requests": "no",
            "served_model_name": "a, b",
            "autoscaling_config": {"target_ongoing_requests": 4},
        },
        _parser(),
    )
    assert argv == ["--model", "smollm2-135m-instruct", "--num-replicas", "2",
                    "--no-enable-prefix-caching", "--enable-auto-tool-choice",
                    "--served-model-name", "a", "b",
                    "--autoscaling-config", '{"target_ongoing_requests": 4}']  # fmt: skip
    args = parse_builder_args({"model": "m", "max_model_len": "2048", "min_replicas": 1,
                               "max_replicas": 3})  # fmt: skip
    assert (
        args.ray
        and args.max_model_len == 2048
        and ray_options(args).autoscaling
        == {
            "min_replicas": 1,
            "max_replicas": 3,
        }
    )


@pytest.mark.parametrize(
    "values, message",
    [
        ({"host": "0.0.0.0"}, "host: set by Serve"),
        ({"ray_address": "auto"}, "ray_address: set by Serve"),
        ({"max_modle_len": 5}, "unknown argument 'max_modle_len'"),
        ({"enable_prefix_caching": "maybe"}, "enable_prefix_caching: expected true or false"),
        ({"num_replicas": 0}, "--num-replicas"),
        ({"request_router": "round-robin"}, "--request-router"),
    ],
)
def test_builder_arguments_are_refused_by_name(values, message):
    with pytest.raises(ValueError, match=message):
        parse_builder_args(values)


def test_ray_flags_need_ray_and_inferd_serve_flags_it_cannot_honour_are_refused():
    assert not uses_ray(_args())
    with pytest.raises(ValueError, match="--num-replicas needs --ray"):
        uses_ray(_args("--num-replicas", "2"))
    with pytest.raises(ValueError, match="--request-router needs --ray"):
        uses_ray(_args("--request-router", "prefix"))  # the default, given: still refused
    with pytest.raises(ValueError, match="--profiler-dir is not available with --ray"):
        ray_options(_args("--ray", "--profiler-dir", "/tmp/x"))
    with pytest.raises(ValueError, match="--tensor-parallel-size > 1"):
        ray_options(_args("--ray", "-tp", "2"))
    assert ray_options(_args("--ray", "--max-num-seqs", "12")).max_ongoing_requests == 12


def test_the_cli_refuses_a_ray_flag_without_ray_before_loading_anything(capsys):
    assert main(["serve", "--max-replicas", "3"]) == 2
    assert "--max-replicas needs --ray" in capsys.readouterr().err


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(min_replicas=3, max_replicas=2), r"--max-replicas \(2\) must be >= --min-replicas"),
        (dict(min_replicas=0, max_replicas=2), "--min-replicas must be >= 1"),
        (dict(max_replicas=2, autoscaling_config={"min_replicas": 2}), "--autoscaling-config"),
        (dict(request_router="x"), "--request-router must be one of"),
        (dict(replica_cpus=-1), "--replica-cpus"),
    ],
)
def test_ray_options_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        RayOptions(**options)


def test_autoscaling_fields_are_checked_by_serve():
    pytest.importorskip("ray.serve")
    with pytest.raises(ValueError, match="(?s)--autoscaling-config: .*target_ongoing_requests"):
        RayOptions(max_replicas=2, autoscaling_config={"target_ongoing_requests": -1})
    options = RayOptions(min_replicas=2, max_replicas=4,
                         autoscaling_config={"downscale_delay_s": 5})  # fmt: skip
    assert options.autoscaling == {"downscale_delay_s": 5, "min_replicas": 2, "max_replicas": 4}
    assert RayOptions(request_router="pow2").router_config().request_router_kwargs == {}
    # Ray's router imports with ray[serve] alone (its public alias needs ray[llm]'s pyarrow).
    ray_prefix = RayOptions(request_router="ray-prefix", router_imbalance=3).router_config()
    assert ray_prefix.request_router_kwargs == {"imbalanced_threshold": 3}
    prefix = RayOptions(block_size=32).router_config()
    assert prefix.request_router_kwargs == {"block_size": 32, "imbalance": 8}


def test_the_serve_config_file_in_docs_deploys_the_builder():
    pytest.importorskip("ray.serve")
    import yaml
    from ray import serve
    from ray.serve.schema import ServeDeploySchema

    config = ServeDeploySchema(**yaml.safe_load((ROOT / "docs/ray_serve.yaml").read_text()))
    [app] = config.applications
    module, _, name = app.import_path.partition(":")
    builder = getattr(__import__(module, fromlist=[name]), name)
    assert isinstance(builder(app.args), serve.Application)
