"""The command line a newcomer reads: every option's help states its default, every command
takes --quiet, `chat --help` lists its in-chat commands, and sampling defaults are stated."""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import pytest

from inferd import cli
from inferd.commands import engine_args


def _leaf_parsers(parser: argparse.ArgumentParser, path: list[str]):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _leaf_parsers(sub, [*path, name])


def _command_parsers():
    for name in cli.COMMANDS:
        top = cli.build_parser(name)
        (sub,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
        yield from _leaf_parsers(sub.choices[name], [name])


def test_every_option_states_its_default_and_every_command_takes_quiet():
    missing, no_quiet = [], []
    for path, parser in _command_parsers():
        options = {s for a in parser._actions for s in a.option_strings}
        if "--quiet" not in options:
            no_quiet.append(" ".join(path))
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0:  # positionals, on/off switches
                continue
            text = parser.formatter_class("inferd")._get_help_string(action) if action.help else ""
            if "default" not in text:
                missing.append(f"{' '.join(path)} {action.option_strings[0]}")
    assert missing == [] and no_quiet == []


def test_numeric_defaults_are_appended_by_the_formatter():
    help_text = cli.build_parser("serve")._subparsers._group_actions[0].choices["serve"]
    assert "(default: 8000)" in help_text.format_help()


def test_chat_help_lists_the_in_chat_commands(capsys):
    with pytest.raises(SystemExit):
        cli.main(["chat", "--help"])
    out = capsys.readouterr().out
    assert "/exit" in out and "/reset" in out and "smollm2-135m-instruct" in out


def _args(command: str, *flags: str) -> argparse.Namespace:
    prompt = ["x"] if command == "generate" else []
    return cli.build_parser(command).parse_args([command, *prompt, *flags])


def test_generate_defaults_to_greedy_with_a_repetition_guard():
    params = engine_args.sampling_params_from_args(_args("generate"))
    assert params.temperature == 0.0 and params.repetition_penalty == 1.1
    params = engine_args.sampling_params_from_args(_args("generate", "--repetition-penalty", "1"))
    assert params.repetition_penalty == 1.0
    chat = engine_args.sampling_params_from_args(_args("chat"))
    assert chat.temperature == 0.0 and chat.repetition_penalty == 1.0


def test_a_generation_config_sets_the_defaults_and_flags_still_win(tmp_path):
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.05, "eos": 2})
    )
    checkpoint = SimpleNamespace(format="hf", path=tmp_path)
    engine = SimpleNamespace(setup=SimpleNamespace(checkpoint=checkpoint))
    defaults = engine_args.model_sampling_defaults(engine)
    assert defaults == {"temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.05}
    params = engine_args.sampling_params_from_args(_args("generate", "--top-p", "0.5"), defaults)
    assert (params.temperature, params.top_p, params.repetition_penalty) == (0.6, 0.5, 1.05)
    gguf = SimpleNamespace(setup=SimpleNamespace(checkpoint=SimpleNamespace(format="gguf")))
    assert engine_args.model_sampling_defaults(gguf) == {}


def test_chat_without_a_chat_model_says_the_embedded_one_is_a_base_model(
    tmp_path, monkeypatch, capsys
):
    from inferd.commands import chat

    monkeypatch.setenv("INFERD_CACHE", str(tmp_path))
    args = _args("chat")
    chat.choose_model(args)
    err = capsys.readouterr().err
    assert args.model is None  # the embedded model
    assert len(err.splitlines()) == 1
    assert "base model" in err and "inferd pull smollm2-135m-instruct" in err
    args = _args("chat", "--model", "some.gguf")
    chat.choose_model(args)
    assert args.model == "some.gguf" and capsys.readouterr().err == ""
