"""Ollama's `options` object → the chat request's sampling fields and the client's context window.

    temperature, top_k, top_p, min_p, seed, stop,
    presence_penalty, frequency_penalty          → the same fields
    repeat_penalty                               → repetition_penalty (over the whole prompt and
                                                   reply: repeat_last_n -1 in Ollama's terms)
    repeat_last_n                                → -1 (as above) or 0 (no repeat penalty); any
                                                   other window is a 400
    num_predict                                  → the reply's token limit (-1, -2: up to the
                                                   context)
    num_ctx                                      → a context window for prompt + reply; a longer
                                                   prompt is a 400 with both lengths (Ollama
                                                   would drop its beginning)
    typical_p 1, tfs_z 1, mirostat 0, penalize_newline false
                                                 → accepted: the values that turn them off
    mirostat_tau, mirostat_eta                   → accepted: without mirostat they do nothing,
                                                   in Ollama as here

Everything else is a 400 naming the option: the runner's load-time options (num_gpu,
num_thread, num_batch, use_mmap, ...) are `inferd serve` flags here, set when the server starts,
and num_keep (what survives a context shift) has no meaning where the context never shifts.
"""

from __future__ import annotations

from typing import Any

from inferd.errors import InvalidRequest
from inferd.server.generation.context_window import ContextWindow

_SAME = {"temperature": float, "top_k": int, "top_p": float, "min_p": float, "seed": int,
         "presence_penalty": float, "frequency_penalty": float}  # fmt: skip
# Accepted with the value that turns the feature off, the only behaviour this server has.
_OFF = {"typical_p": (1, 1.0), "tfs_z": (1, 1.0), "mirostat": (0,), "penalize_newline": (False,)}
_NO_EFFECT = ("mirostat_tau", "mirostat_eta")  # mirostat's own knobs: nothing without it
_LOAD_TIME = ("numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all",
              "vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread")  # fmt: skip

# The chat request's field → this API's, for errors raised later (chat_pipeline.renamed).
OPTION_NAMES = {
    "max_completion_tokens": "options.num_predict",
    "repetition_penalty": "options.repeat_penalty",
    **{name: f"options.{name}" for name in (*_SAME, "stop")},
}


def _number(name: str, value: Any, kind: type) -> int | float:
    """A JSON number of the option's kind (an integral float such as 40.0 counts as an int)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"options.{name}", f"options.{name} must be a number, got {value!r}")
    if kind is int:
        if value != int(value):
            raise InvalidRequest(
                f"options.{name}", f"options.{name} must be an integer, got {value!r}"
            )
        return int(value)
    return float(value)


def _refused(name: str, value: Any) -> InvalidRequest:
    if name in _LOAD_TIME:
        why = ("a load-time option of Ollama's runner; this server's model is loaded when "
               "`inferd serve` starts, with its flags")  # fmt: skip
    elif name in _OFF:
        allowed = " or ".join(repr(v) for v in dict.fromkeys(_OFF[name]))
        why = f"only {allowed} is supported (the feature is not implemented)"
    elif name == "num_keep":
        why = "this server never shifts the context (it refuses a prompt that does not fit)"
    else:
        why = "not an option this server knows"
    return InvalidRequest(f"options.{name}", f"unsupported option: options.{name}={value!r}: {why}")


def _is_off(name: str, value: Any) -> bool:
    # NOTE: bool is an int in Python (False == 0): the type must match as well as the value.
    return value in _OFF[name] and isinstance(value, bool) == (name == "penalize_newline")


def _max_tokens(value: Any) -> int | None:
    n = _number("num_predict", value, int)
    if n in (-1, -2):  # Ollama: no limit / fill the context
        return None
    if n < 1:
        raise InvalidRequest(
            "options.num_predict",
            f"options.num_predict must be -1, -2 or an integer >= 1, got {n}",
        )
    return n


def _stop(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise InvalidRequest("options.stop", "options.stop must be a list of strings")
    return value


def chat_fields(options: dict[str, Any] | None) -> tuple[dict[str, Any], ContextWindow | None]:
    """(the chat request's fields, the context window) that `options` ask for."""
    fields: dict[str, Any] = {}
    window = None
    options = options or {}
    for name, value in options.items():
        if value is None:  # an unset option (clients serialise them as null)
            continue
        if name in _SAME:
            fields[name] = _number(name, value, _SAME[name])
        elif name == "repeat_penalty":
            fields["repetition_penalty"] = _number(name, value, float)
        elif name == "repeat_last_n":
            if _number(name, value, int) not in (-1, 0):
                raise InvalidRequest(
                    "options.repeat_last_n",
                    f"unsupported option: options.repeat_last_n={value!r}: only -1 (the "
                    "whole prompt and reply, the window repeat_penalty covers here) or 0 (no "
                    "repeat penalty)",
                )
        elif name == "num_predict":
            fields["max_completion_tokens"] = _max_tokens(value)
        elif name == "num_ctx":
            tokens = _number(name, value, int)
            if tokens < 1:
                message = f"options.num_ctx must be >= 1, got {tokens}"
                raise InvalidRequest("options.num_ctx", message)
            window = ContextWindow(tokens)
        elif name == "stop":
            fields["stop"] = _stop(value)
        elif name in _NO_EFFECT:
            _number(name, value, float)
        elif name in _OFF and _is_off(name, value):
            continue
        else:
            raise _refused(name, value)
    if options.get("repeat_last_n") == 0:  # Ollama: a window of 0 turns the penalty off
        fields.pop("repetition_penalty", None)
    return {k: v for k, v in fields.items() if v is not None}, window
